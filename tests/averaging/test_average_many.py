"""Averaging checkpoints of many tensors: each input's manifest read once and compared without
per-name work when it matches, a repeated input read once, and the parsers' fast checks as
strict as before. (How long it takes is measured in bench/average_empty.py, never here.)"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

import statekeeper as sk
from statekeeper.averaging import plan
from statekeeper.averaging.offline import average_checkpoints
from statekeeper.cli.main import main as cli
from statekeeper.format.safetensors_header import read_header
from statekeeper.interop import reading


def _state(seed: int, extra: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    tensors = {f"t{i}": torch.randn(3, generator=g) for i in range(40)}
    tensors.update({f"e{i}": torch.empty(0) for i in range(20)})
    tensors["count"] = torch.tensor([seed])
    return {"model": tensors, "epoch": seed, "config": {"extra": extra}}


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    # (typing) an internal function the test drives or wraps
    real = plan.read_manifest  # type: ignore[attr-defined]

    def counting(location: Any) -> Any:
        reads.append(location.path())
        return real(location)

    monkeypatch.setattr(plan, "read_manifest", counting)
    return reads


def test_an_input_named_twice_is_read_once_and_weighs_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    sk.save(a, _state(1), step=1)
    sk.save(b, _state(2), step=2)
    reads = _count_reads(monkeypatch)
    average_checkpoints([a, b, a], tmp_path / "out")
    assert len(reads) == 2 and len(set(reads)) == 2
    got = sk.read(tmp_path / "out")["model"]
    x, y = sk.read(a)["model"], sk.read(b)["model"]
    for i in range(40):
        name = f"t{i}"
        expected = ((x[name].double() * 2 + y[name].double()) / 3).to(torch.float32)
        assert torch.equal(got[name], expected), name
    assert got["count"].item() == 2 and got["e0"].shape == (0,)


def test_inputs_that_differ_only_in_values_match_and_values_come_from_the_newest(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    sk.save(a, _state(1, extra=5), step=3)  # other values (epoch, config) differ
    sk.save(b, _state(2, extra=7), step=4)
    average_checkpoints([a, b], tmp_path / "out")
    out = sk.read(tmp_path / "out")
    assert out["epoch"] == 2 and out["config"] == {"extra": 7}


def test_every_difference_is_still_listed_when_the_fast_comparison_fails(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    sk.save(a, _state(1), step=1)
    other = _state(2)
    other["model"]["t3"] = torch.zeros(4)  # shape
    other["model"]["t5"] = torch.zeros(3, dtype=torch.float64)  # dtype
    del other["model"]["t7"]  # missing
    sk.save(b, other, step=2)
    with pytest.raises(sk.KeyMismatchError) as info:
        average_checkpoints([a, b], tmp_path / "out")
    text = str(info.value)
    assert "model/t3: shape" in text and "model/t5: dtype" in text and "model/t7" in text


def _header_file(path: Path, shape: object) -> Path:
    header = json.dumps({"x": {"dtype": "F32", "shape": shape, "data_offsets": [0, 4]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 4)
    return path


@pytest.mark.parametrize(
    ("shape", "problem"),
    [([True], "malformed"), ([1.0], "malformed"), (["1"], "malformed"), ([-1, -4], "negative")],
)
def test_header_dimensions_are_exact_non_negative_ints(
    tmp_path: Path, shape: object, problem: str
) -> None:
    data = _header_file(tmp_path / "x.safetensors", shape).read_bytes()
    with pytest.raises(ValueError, match=problem):
        read_header(memoryview(data))


@pytest.mark.parametrize("dims", ["[true]", "[1.5]", '["3"]', "3"])
def test_manifest_shapes_are_lists_of_exact_ints(tmp_path: Path, dims: str) -> None:
    sk.save(tmp_path / "run", {"model": {"w": torch.zeros(3)}}, step=1)
    step = tmp_path / "run" / "step_000000001"
    manifest = step / "manifest.json"
    text = manifest.read_text().replace('"shape":[3]', f'"shape":{dims}')
    manifest.write_text(text)
    # re-sign the edited manifest: only the shape check may refuse it
    from statekeeper.format.checksum import checksum

    at = text.rindex('"manifest_checksum":"') + len('"manifest_checksum":"xxh3_128:')
    zeroed = text[:at] + "0" * 32 + text[at + 32 :]
    signed = text[:at] + checksum(zeroed.encode()).split(":")[1] + text[at + 32 :]
    manifest.write_text(signed)
    with pytest.raises(sk.CorruptCheckpointError, match="malformed"):
        sk.read(tmp_path / "run")


def test_the_cli_reads_a_foreign_file_named_twice_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "m.safetensors"
    save_file({f"t{i}": torch.full((2,), float(i)) for i in range(30)}, str(file))
    reads: list[str] = []
    real = reading.read

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr("statekeeper.cli.average.read", counting)
    out = tmp_path / "out"
    done = CliRunner().invoke(cli, ["average", str(file), str(file), "-o", str(out), "--json"])
    assert done.exit_code == 0, done.output
    assert reads == [str(file)]
    got = sk.read(out)
    assert all(torch.equal(got[f"t{i}"], torch.full((2,), float(i))) for i in range(30))
    assert json.loads(done.output)["tensors"] == 30


def test_an_entry_that_is_null_in_one_input_is_a_mismatch(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    sk.save(a, {"model": None}, step=1)
    sk.save(b, {"model": {"w": torch.ones(2)}}, step=2)
    with pytest.raises(sk.KeyMismatchError, match="model/w"):
        average_checkpoints([a, b], tmp_path / "out", key="model")
