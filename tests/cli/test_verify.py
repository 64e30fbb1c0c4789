from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from click.testing import Result

from statekeeper.format.manifest import Manifest

Invoke = Callable[..., Result]
StepDir = Callable[[Path, int], Path]
Shard = Callable[[Path], Path]
Flip = Callable[[Path, int], None]


def _json(result: Result) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_verify_good_run(invoke: Invoke, run_dir: Path, step_dir: StepDir) -> None:
    result = invoke("verify", run_dir)
    assert result.exit_code == 0, result.output
    ok_lines = [line for line in result.stdout.splitlines() if line.startswith("OK")]
    assert len(ok_lines) == 2
    assert "step 1" in ok_lines[0] and "step 2" in ok_lines[1]
    assert "all 2 step(s) verified" in result.stdout
    data = _json(invoke("verify", run_dir, "--json"))
    assert data["ok"] is True
    for entry, step in zip(data["steps"], (1, 2), strict=True):
        path = step_dir(run_dir, step)
        size = sum(f.stat().st_size for f in path.iterdir())
        assert entry == {"step": step, "path": str(path), "ok": True, "error": None, "bytes": size}


def test_verify_flipped_byte_fails_and_names_the_file(
    invoke: Invoke, run_dir: Path, step_dir: StepDir, shard: Shard, flip_byte: Flip
) -> None:
    damaged = shard(step_dir(run_dir, 2))
    flip_byte(damaged, -1)
    result = invoke("verify", run_dir)
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("OK") and "step 1" in lines[0]
    assert lines[1].startswith("FAILED  step 2") and str(damaged) in lines[1]
    assert "checksum mismatch" in lines[1]
    assert "1 of 2 step(s) failed verification" in result.stdout
    data = _json(invoke("verify", run_dir, "--json"))
    assert data["ok"] is False
    assert [s["ok"] for s in data["steps"]] == [True, False]
    assert damaged.name in data["steps"][1]["error"]
    # the good step alone still passes
    assert invoke("verify", run_dir, "--step", 1).exit_code == 0
    assert invoke("verify", step_dir(run_dir, 2)).exit_code == 1


def test_verify_decodes_shards_against_the_manifest(
    invoke: Invoke, run_dir: Path, step_dir: StepDir
) -> None:
    # a manifest that is self-consistent (valid checksums) but lies about a tensor's dtype:
    # only decoding the shard and comparing its header catches it
    path = step_dir(run_dir, 1) / "manifest.json"
    manifest = Manifest.from_bytes(str(path), path.read_bytes())
    record = manifest.tensors["model/proj.bias"]
    tensors = {**manifest.tensors, "model/proj.bias": record._replace(dtype="int32")}
    path.write_bytes(dataclasses.replace(manifest, tensors=tensors).to_bytes())
    result = invoke("verify", step_dir(run_dir, 1), "--json")
    assert result.exit_code == 1
    (entry,) = _json(result)["steps"]
    assert entry["ok"] is False and entry["step"] == 1
    assert "'model/proj.bias' is missing or differs from the manifest" in entry["error"]


def test_verify_missing_file_and_missing_manifest(
    invoke: Invoke, run_dir: Path, step_dir: StepDir, shard: Shard
) -> None:
    shard(step_dir(run_dir, 1)).unlink()
    (step_dir(run_dir, 2) / "manifest.json").unlink()
    data = _json(invoke("verify", run_dir, "--json"))
    assert data["ok"] is False
    errors = [s["error"] for s in data["steps"]]
    assert "file listed in the manifest is missing" in errors[0]
    assert "manifest.json is missing" in errors[1]
    assert data["steps"][1]["bytes"] == 0
    # a step directory without its manifest is still reported as a damaged step
    result = invoke("verify", step_dir(run_dir, 2))
    assert result.exit_code == 1
    assert "manifest.json is missing" in result.stdout


def test_verify_usage_errors_exit_2(invoke: Invoke, run_dir: Path, tmp_path: Path) -> None:
    missing = invoke("verify", tmp_path / "nope")
    assert missing.exit_code == 2
    assert str(tmp_path / "nope") in missing.stderr
    empty = tmp_path / "empty"
    (empty / "step_000000003.partial-abc").mkdir(parents=True)
    nothing = invoke("verify", empty, "--json")
    assert nothing.exit_code == 2
    assert nothing.stdout == ""
    assert "holds no committed checkpoint" in nothing.stderr
    unknown = invoke("verify", run_dir, "--step", 5)
    assert unknown.exit_code == 2
    assert "committed steps: 1, 2" in unknown.stderr
    for result in (missing, nothing, unknown):
        assert result.stderr.startswith("Error: ")
        assert "Traceback" not in result.output


def test_verify_names_foreign_checkpoints_and_missing_paths(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from safetensors.torch import save_file

    from statekeeper.cli.main import main

    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({"w": torch.ones(2)}, str(folder / "model.safetensors"))
    torch.save({"w": torch.ones(2)}, tmp_path / "weights.pt")
    runner = CliRunner()
    for target, kind in ((folder, "huggingface"), (tmp_path / "weights.pt", "torch")):
        result = runner.invoke(main, ["verify", str(target)])
        assert result.exit_code == 2
        assert f"is a {kind} checkpoint, not a statekeeper step" in result.output
        assert "statekeeper inspect" in result.output and "no committed" not in result.output
    missing = runner.invoke(main, ["verify", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
