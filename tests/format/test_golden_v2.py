"""Format version 2 (sharded steps) is pinned byte for byte by tests/golden/v2/."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import torch

import statekeeper as sk
from statekeeper.format.checksum import checksum
from statekeeper.testing import assert_state_equal

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
STEP_DIR = GOLDEN / "v2" / "step_000000011"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden_v2", GOLDEN / "make_golden_v2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_regenerating_gives_identical_bytes(tmp_path: Path) -> None:
    fresh = gen.write_golden(tmp_path)
    golden = {p.name: p.read_bytes() for p in STEP_DIR.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == [STEP_DIR.name]
    assert {p.name: p.read_bytes() for p in fresh.iterdir()} == golden


def test_reads_as_the_expected_state_with_rank_0_entries() -> None:
    state = sk.read(STEP_DIR)
    assert_state_equal(state, gen.expected_state(rank=0))
    assert sk.read(GOLDEN / "v2", step=11)["model"]["w"].shape == (4, 3)


def test_loads_into_live_objects() -> None:
    live = {"model": {"w": torch.zeros(4, 3), "b": torch.zeros(4, dtype=torch.bfloat16)}}
    sk.load(STEP_DIR, live, strict=sk.Strict.PARTIAL)
    assert torch.equal(live["model"]["w"], gen.W)


def _copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(STEP_DIR, run / STEP_DIR.name)
    return run / STEP_DIR.name


def _resign(step: Path, edit: str, to: str) -> None:
    path = step / "manifest.json"
    text = path.read_text()
    assert edit in text
    text = text.replace(edit, to)
    stored = json.loads(text)["manifest_checksum"]
    zeroed = text.replace(stored.split(":")[1], "0" * 32)
    path.write_text(zeroed.replace("0" * 32, checksum(zeroed.encode()).split(":")[1], 1))


@pytest.mark.parametrize(
    ("edit", "to", "problem"),
    [
        ('"offsets":[2,0]', '"offsets":[3,0]', "do not lie inside"),
        ('"offsets":[2,0]', '"offsets":[0,0]', "w"),  # overlapping: a row is never covered
        ('"shape":[4,3],"chunks"', '"shape":[5,3],"chunks"', "cover"),
    ],
)
def test_chunks_that_do_not_tile_are_corrupt(
    tmp_path: Path, edit: str, to: str, problem: str
) -> None:
    step = _copy(tmp_path)
    _resign(step, edit, to)
    with pytest.raises(sk.CorruptCheckpointError, match=problem):
        sk.read(step)


def test_damaged_chunk_file_is_named(tmp_path: Path) -> None:
    step = _copy(tmp_path)
    chunk = step / "chunks-00001.safetensors"
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 1
    chunk.write_bytes(bytes(data))
    with pytest.raises(sk.CorruptCheckpointError, match="chunks-00001"):
        sk.read(step)


def test_cli_inspects_a_sharded_step(capsys: pytest.CaptureFixture[str]) -> None:
    from statekeeper.cli.main import main as cli

    assert cli.main(["inspect", str(STEP_DIR), "--json"], standalone_mode=False) in (None, 0)
    report = json.loads(capsys.readouterr().out)
    entries = {e["name"]: e for e in report["entries"]}
    weight = next(t for t in entries["model"]["tensors"] if t["key"] == "w")
    assert (weight["shape"], weight["chunks"], weight["bytes"]) == ([4, 3], 2, 48)
    assert {"sampler (rank 0)", "sampler (rank 1)"} <= set(entries)
    assert not any(t["name"].startswith("$chunk/") for e in entries.values() for t in e["tensors"])


def test_average_reads_sharded_steps(tmp_path: Path) -> None:
    other = _copy(tmp_path)  # the same step, once more: the mean equals the input
    sk.averaging.average_checkpoints([STEP_DIR, other], tmp_path / "avg", key="model")
    averaged = sk.read(tmp_path / "avg")["model"]
    assert torch.equal(averaged["w"], gen.W) and torch.equal(averaged["b"], gen.B)


def test_tiling_of_many_column_chunks_is_decided_on_the_grid() -> None:
    """Column chunks all start at row 0: the row sweep would compare every pair (a crafted
    manifest of 8,000 chunks took 27 s); the grid check is linear."""
    from statekeeper.format.sharding import _grid_overlap, tiling_problem

    n = 20_000
    shape = (4, n)
    boxes = [((0, i), (4, 1)) for i in range(n)]
    assert _grid_overlap(shape, boxes) == ""  # the linear path decides
    assert tiling_problem(shape, boxes) is None
    overlapping = [*boxes[:-1], ((0, n - 2), (4, 2))]
    assert tiling_problem(shape, overlapping) == f"overlap (at (0, {n - 2}) and (0, {n - 2}))"
    assert tiling_problem(shape, boxes[:-1]) == f"cover {4 * (n - 1)} of its {4 * n} elements"
