"""The Python API under ``statekeeper inspect`` and ``verify``: typed, frozen reports.

``inspect`` and ``verify`` are called directly (not through the command line) on intact,
damaged and missing steps, runs of several steps, and a Storage.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers.no_torch import REFUSE_TORCH

import statekeeper as sk
from statekeeper.catalog.inspection import (
    UNREFERENCED,
    EntryReport,
    InspectReport,
    ReportTotals,
    TensorRow,
    ValueRow,
    inspect_step,
)
from statekeeper.catalog.verification import (
    StepVerifyReport,
    VerifyReport,
    step_locations,
)
from statekeeper.catalog.verify import verify
from statekeeper.errors import (
    CorruptCheckpointError,
    InvalidArgumentError,
    StepNotFoundError,
)
from statekeeper.interop.inspection import inspect
from statekeeper.storage.memory import MemoryStorage


class Tied(torch.nn.Module):
    """An embedding whose output head shares its weight: stored once, plus one alias."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(6, 4)
        self.head = torch.nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight


def _state(seed: int) -> dict[str, object]:
    torch.manual_seed(seed)
    return {
        "model": Tied(),
        "extra": torch.zeros(3, 5, dtype=torch.bfloat16),
        "array": np.arange(4, dtype=np.int64),
        "epoch": seed,
        "config": {"lr": 0.01, "ids": list(range(500))},
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """Committed steps 1 and 2 (step 2 with metrics)."""
    sk.save(tmp_path / "run", _state(1), step=1)
    sk.save(tmp_path / "run", _state(2), step=2, metrics={"loss": 0.75})
    return tmp_path / "run"


def _step(run: Path, step: int) -> Path:
    return run / f"step_{step:09d}"


def _flip_last_byte(step_dir: Path) -> Path:
    shard = next(step_dir.glob("tensors-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    return shard


def test_inspect_reports_the_newest_step_as_typed_frozen_rows(run: Path) -> None:
    report = inspect(run)
    assert isinstance(report, InspectReport)
    assert (report.step, report.path, dict(report.metrics)) == (
        2,
        str(_step(run, 2)),
        {"loss": 0.75},
    )
    assert report.library["torch"] == torch.__version__.split("+")[0]
    entries = {entry.name: entry for entry in report.entries}
    assert list(entries) == ["model", "extra", "array", "epoch", "config"]
    assert all(isinstance(entry, EntryReport) for entry in report.entries)
    model = entries["model"]
    rows = {row.key: row for row in model.tensors}
    assert all(isinstance(row, TensorRow) for row in model.tensors)
    embed, head = rows["embed.weight"], rows["head.weight"]
    assert (embed.shape, embed.dtype, embed.bytes, embed.alias_of) == ((6, 4), "float32", 96, None)
    assert embed.file is not None and embed.name == "model/embed.weight"
    assert (head.bytes, head.alias_of, head.file) == (0, "model/embed.weight", None)
    assert model.tensor_bytes == 96
    assert dict(report.aliases) == {"model/head.weight": "model/embed.weight"}
    (extra,) = entries["extra"].tensors
    assert (extra.key, extra.shape, extra.dtype, extra.bytes) == ("", (3, 5), "bfloat16", 30)
    (array,) = entries["array"].tensors
    assert array.numpy and array.dtype == "int64"
    (epoch,) = entries["epoch"].values
    assert epoch == ValueRow("epoch", "", "int", "2", True)
    values = {row.key: row for row in entries["config"].values}
    assert values["lr"].complete and values["lr"].value == "0.01"
    assert not values["ids"].complete and values["ids"].value == "<list of 500 int>"
    totals = report.totals
    assert isinstance(totals, ReportTotals)
    on_disk = sum(f.stat().st_size for f in _step(run, 2).iterdir())
    assert (totals.tensors, totals.stored, totals.aliases) == (4, 3, 1)
    assert (totals.tensor_bytes, totals.values, totals.file_bytes) == (96 + 30 + 32, 3, on_disk)
    assert totals.files == len(list(_step(run, 2).iterdir()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.step = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.tensor_bytes = 0


def test_inspect_picks_a_step_and_takes_step_directories_and_storages(run: Path) -> None:
    first = inspect(run, step=1)
    assert isinstance(first, InspectReport) and first.step == 1 and first.metrics == {}
    assert inspect(_step(run, 1)) == first  # the same report, from the step directory
    assert inspect_step(str(run), 1) == first
    storage = MemoryStorage()
    sk.save(storage, {"w": torch.ones(2)}, step=4)
    in_memory = inspect(storage)
    assert isinstance(in_memory, InspectReport) and in_memory.step == 4
    assert [row.key for entry in in_memory.entries for row in entry.tensors] == [""]


def test_inspect_of_a_damaged_manifest_or_missing_target_raises(run: Path, tmp_path: Path) -> None:
    manifest = _step(run, 2) / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:-5])
    with pytest.raises(CorruptCheckpointError, match=r"manifest\.json"):
        inspect(run)
    assert isinstance(inspect(run, step=1), InspectReport)  # the other step still reads
    with pytest.raises(StepNotFoundError, match="committed steps: 1, 2"):
        inspect(run, step=7)
    with pytest.raises(StepNotFoundError, match="is not a directory"):
        inspect(tmp_path / "nope")
    with pytest.raises(InvalidArgumentError, match="single step"):
        inspect(_step(run, 1), step=2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StepNotFoundError, match="holds no committed checkpoint"):
        inspect(tmp_path / "empty")


def test_inspect_reads_only_the_manifest(run: Path) -> None:
    _flip_last_byte(_step(run, 2))  # tensor data is not read: the report is whole
    report = inspect(run)
    assert isinstance(report, InspectReport) and report.totals.tensors == 4


def test_overlapping_views_share_one_stored_base_listed_as_unreferenced(tmp_path: Path) -> None:
    base = torch.arange(10.0)
    sk.save(tmp_path, {"a": base[0:4], "b": base[2:6], "m": {"x": base[1:3]}}, step=1)
    report = inspect(tmp_path)
    assert isinstance(report, InspectReport)
    entries = {entry.name: entry for entry in report.entries}
    assert list(entries) == ["a", "b", "m", UNREFERENCED]
    (stored,) = entries[UNREFERENCED].tensors
    assert (stored.in_state, stored.bytes, stored.alias_of) == (False, 24, None)  # 0..5 used
    views = [row for name in ("a", "b", "m") for row in entries[name].tensors]
    assert {row.alias_of for row in views} == {stored.name}
    assert [row.shape for row in views] == [(4,), (4,), (2,)]
    assert (report.totals.tensors, report.totals.stored, report.totals.aliases) == (3, 1, 3)


def test_verify_intact_run_reports_every_step(run: Path) -> None:
    report = verify(run)
    assert isinstance(report, VerifyReport) and report.ok and report.failed == ()
    assert [s.step for s in report.steps] == [1, 2]
    for result, step in zip(report.steps, (1, 2), strict=True):
        size = sum(f.stat().st_size for f in _step(run, step).iterdir())
        assert result == StepVerifyReport(step, str(_step(run, step)), True, None, size)
    only = verify(run, step=1)
    assert [s.step for s in only.steps] == [1] and only.ok
    assert verify(_step(run, 2)).steps == report.steps[1:]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.ok = False


def test_verify_reports_a_damaged_step_without_raising(run: Path) -> None:
    shard = _flip_last_byte(_step(run, 2))
    report = verify(run)
    assert not report.ok
    assert [s.ok for s in report.steps] == [True, False]
    (failed,) = report.failed
    assert failed.step == 2 and failed.error is not None
    assert str(shard) in failed.error and "checksum mismatch" in failed.error
    assert failed.bytes == sum(f.stat().st_size for f in _step(run, 2).iterdir())
    assert verify(run, step=1).ok


def test_verify_reports_a_step_whose_manifest_is_gone(run: Path) -> None:
    (_step(run, 2) / "manifest.json").unlink()
    report = verify(_step(run, 2))  # still a step (named as one): damaged, not missing
    (result,) = report.steps
    assert (result.step, result.ok, result.bytes) == (2, False, 0)
    assert result.error is not None and "manifest.json is missing" in result.error
    with pytest.raises(InvalidArgumentError, match="is step 2"):
        verify(_step(run, 2), step=1)


def test_verify_raises_when_there_is_nothing_to_verify(run: Path, tmp_path: Path) -> None:
    with pytest.raises(StepNotFoundError, match="does not exist"):
        verify(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(StepNotFoundError, match=r"is a file|is not a directory"):
        step_locations(tmp_path / "file")
    (tmp_path / "empty" / "step_000000003.partial-abc").mkdir(parents=True)
    with pytest.raises(StepNotFoundError, match="holds no committed checkpoint"):
        verify(tmp_path / "empty")
    with pytest.raises(StepNotFoundError, match="committed steps: 1, 2"):
        verify(run, step=5)


def test_verify_of_a_storage_and_progress_over_all_steps(run: Path) -> None:
    storage = MemoryStorage()
    sk.save(storage, {"w": torch.ones(1000)}, step=1)
    sk.save(storage, {"w": torch.zeros(10)}, step=2)
    assert [loc.step for loc in step_locations(storage)] == [1, 2]
    calls: list[tuple[int, int]] = []
    report = verify(storage, progress=lambda done, total: calls.append((done, total)))
    assert report.ok and [s.step for s in report.steps] == [1, 2]
    totals = {total for _, total in calls}
    assert len(totals) == 1  # one total for the whole verification
    (total,) = totals
    data = sum(s.bytes for s in report.steps) - sum(
        storage.size(loc.entry, "manifest.json") for loc in step_locations(storage)
    )
    assert total == data
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == total
    assert verify(storage, step=2).steps == report.steps[1:]


CHILD = (
    REFUSE_TORCH
    + r"""
from statekeeper.interop.inspection import inspect
from statekeeper.catalog.verify import verify

report = inspect(sys.argv[1])
assert report.step == 2 and report.totals.tensors == 4, report
assert verify(sys.argv[1], progress=lambda done, total: None).ok
print("ok")
"""
)


def test_inspect_and_verify_of_statekeeper_steps_import_neither_torch_nor_numpy(
    run: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(run)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
