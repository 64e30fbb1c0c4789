from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import Result

import statekeeper as sk
from statekeeper.format.manifest import Manifest

Invoke = Callable[..., Result]


def _model(seed: int, out: int = 6) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, out), torch.nn.BatchNorm1d(out))


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    paths = []
    for seed, step in enumerate((10, 20, 30)):
        run = tmp_path / f"in{seed}"
        sk.save(run, {"model": _model(seed), "epoch": seed}, step=step)
        paths.append(run)
    return paths


def _json(result: Result) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_average_human_output(invoke: Invoke, runs: list[Path], tmp_path: Path) -> None:
    result = invoke("average", *runs, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for line, run, step in zip(lines[:3], runs, (10, 20, 30), strict=True):
        assert line == f"0.3333  {run / f'step_{step:09d}'}"
    assert lines[3].startswith("averaged 3 checkpoint(s), 7 tensor(s) -> step 30  ")
    assert lines[3].endswith(str(tmp_path / "out" / "step_000000030"))
    out = sk.read(tmp_path / "out")
    assert set(out) == {"model", "epoch"} and out["epoch"] == 2
    expected = sum(_model(s)[0].weight.detach().double() for s in range(3)) / 3
    # (typing) expected is a tensor read back
    assert torch.equal(out["model"]["0.weight"], expected.float())  # type: ignore[attr-defined]


def test_average_json_weights_and_key(invoke: Invoke, runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke("average", *runs, "-o", out, "--weights", "2,3,5", "--key", "model", "--json")
    assert result.exit_code == 0, result.output
    data = _json(result)
    step_dir = out / "step_000000030"
    manifest = Manifest.from_bytes("m", (step_dir / "manifest.json").read_bytes())
    assert data == {
        "out": str(step_dir),
        "step": 30,
        "inputs": [str(r / f"step_{s:09d}") for r, s in zip(runs, (10, 20, 30), strict=True)],
        "weights": [0.2, 0.3, 0.5],
        "tensors": len(manifest.tensors),
        "bytes": sum(f.stat().st_size for f in step_dir.iterdir()),
    }
    assert list(sk.read(out)) == ["model"]
    again = invoke("average", *runs, "-o", out, "--out-step", "31", "--json")
    assert again.exit_code == 0 and _json(again)["step"] == 31


def test_average_mismatch_exits_1(invoke: Invoke, runs: list[Path], tmp_path: Path) -> None:
    sk.save(tmp_path / "odd", {"model": _model(0, out=7), "epoch": 0}, step=1)
    result = invoke("average", *runs, tmp_path / "odd", "-o", tmp_path / "out", "--json")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ")
    assert "model/0.weight: shape (7, 4)" in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
    existing = invoke("average", *runs, "-o", runs[2])
    assert existing.exit_code == 1 and "already committed" in existing.stderr
    sk.save(tmp_path / "other", {"net": torch.zeros(2)}, step=40)
    partly = invoke("average", *runs, tmp_path / "other", "-o", tmp_path / "out", "--key", "model")
    assert partly.exit_code == 1 and "model: no such entry in " in partly.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--weights", "1,x,2"], "expected comma-separated numbers"),
        (["--weights", "1,2"], "2 weight(s) for 3 checkpoint(s)"),
        (["--weights", "1,-1,2"], "finite and >= 0"),
        (["--weights", "0,0,0"], "sum to"),
        (["--key", "nope"], "no checkpoint holds the entry 'nope' (entries: model, epoch)"),
    ],
)
def test_average_argument_errors(
    invoke: Invoke, runs: list[Path], tmp_path: Path, args: list[str], message: str
) -> None:
    result = invoke("average", *runs, "-o", tmp_path / "out", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert "Traceback" not in result.output


def test_average_usage_errors_exit_2(invoke: Invoke, runs: list[Path], tmp_path: Path) -> None:
    missing = invoke("average", runs[0], tmp_path / "nope", "-o", tmp_path / "out")
    assert missing.exit_code == 2 and str(tmp_path / "nope") in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = invoke("average", empty, "-o", tmp_path / "out")
    assert nothing.exit_code == 2 and "holds no committed checkpoint" in nothing.stderr
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    refused = invoke("average", junk, "-o", tmp_path / "out")
    assert refused.exit_code == 2 and "not a checkpoint format" in refused.stderr
    assert invoke("average", *runs).exit_code == 2  # -o is required
    assert invoke("average", "-o", tmp_path / "out").exit_code == 2  # at least one CKPT


def test_average_onto_an_existing_step_names_the_cli_flag(
    invoke: Invoke, runs: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert invoke("average", *runs, "-o", out).exit_code == 0
    again = invoke("average", *runs, "-o", out)
    assert again.exit_code == 1 and "pass --overwrite" in again.stderr
    assert "overwrite=True" not in again.stderr
    replaced = invoke("average", runs[0], runs[1], "-o", out, "--overwrite", "--out-step", "30")
    assert replaced.exit_code == 0, replaced.output
    expected = (_model(0)[0].weight + _model(1)[0].weight) / 2
    assert torch.allclose(sk.read(out)["model"]["0.weight"], expected)


def test_average_reads_the_files_every_other_command_reads(invoke: Invoke, tmp_path: Path) -> None:
    import safetensors.torch

    first, second = _model(1), _model(2)
    torch.save(first.state_dict(), tmp_path / "a.pt")
    safetensors.torch.save_file(
        {k: v.contiguous() for k, v in second.state_dict().items()}, tmp_path / "b.safetensors"
    )
    sk.save(tmp_path / "run", dict(_model(3).state_dict()), step=7)
    result = invoke(
        "average", tmp_path / "a.pt", tmp_path / "b.safetensors", tmp_path / "run",
        "-o", tmp_path / "out", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert _json(result)["step"] == 7  # the newest statekeeper input's step
    assert _json(result)["tensors"] == len(first.state_dict())  # tensors, not inputs
    averaged = sk.read(tmp_path / "out")
    for name, value in first.state_dict().items():
        others = (second.state_dict()[name], _model(3).state_dict()[name])
        if value.dtype.is_floating_point:
            expected = ((value.double() + others[0].double() + others[1].double()) / 3).float()
            assert torch.equal(averaged[name], expected), name
        else:  # integer buffers (BatchNorm's counter) come from the last input
            assert torch.equal(averaged[name], others[1]), name
    mismatched = tmp_path / "c.pt"
    torch.save(_model(4, out=5).state_dict(), mismatched)
    bad = invoke("average", tmp_path / "a.pt", mismatched, "-o", tmp_path / "bad")
    assert bad.exit_code == 1, bad.output
    assert "0.weight" in bad.stderr and "c.pt" in bad.stderr
