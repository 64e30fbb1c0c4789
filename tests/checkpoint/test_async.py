"""Asynchronous saves: snapshots, one at a time, errors never lost, kills never commit."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest
import torch

import statekeeper as sk
from statekeeper.storage.memory import MemoryStorage
from statekeeper.testing import assert_state_equal

ROOT = Path(__file__).resolve().parents[2]


def test_staged_values_are_a_snapshot(tmp_path: Path) -> None:
    model = torch.nn.Linear(64, 64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pending = sk.save(tmp_path, {"model": model}, step=1, blocking=False)
    with torch.no_grad():
        model.weight.add_(1.0)  # the training loop goes on at once
    info = pending.wait()
    assert info.step == 1
    assert_state_equal(dict(sk.read(tmp_path)["model"]), before)


def test_two_saves_in_a_row_never_interleave() -> None:
    storage = MemoryStorage()
    with sk.Checkpointer(storage, blocking=False) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, {"x": torch.full((1000,), float(step))})
    commits = [i for i, op in enumerate(storage.log) if op.startswith("rename")]
    starts = [i for i, op in enumerate(storage.log) if op.startswith("mkdir")]
    assert len(commits) == len(starts) == 3
    assert starts[1] > commits[0] and starts[2] > commits[1]
    assert [c.step for c in sk.list_checkpoints(storage)] == [1, 2, 3]


def test_a_background_failure_surfaces_on_the_next_call_and_on_close() -> None:
    storage = MemoryStorage()
    ckpt = sk.Checkpointer(storage, blocking=False)
    ckpt.save(1, {"x": 1})
    ckpt.wait()
    storage.fail_at = storage.operations + 2
    ckpt.save(2, {"x": 2})  # fails in the background
    with pytest.raises(sk.storage.InjectedFailure):
        ckpt.save(3, {"x": 3})
    assert [c.step for c in sk.list_checkpoints(storage)] == [1]
    storage.fail_at = storage.operations + 2
    ckpt.save(4, {"x": 4})
    with pytest.raises(sk.storage.InjectedFailure):
        ckpt.close()
    assert [c.step for c in sk.list_checkpoints(storage)] == [1]
    with sk.Checkpointer(storage) as again:  # close released the lock despite the error
        assert again.restore_latest({"x": 0}) == 1


def test_pending_save_wait_raises_once(tmp_path: Path) -> None:
    storage = MemoryStorage()
    storage.fail_at = 1
    pending = sk.save(storage, {"x": 1}, step=1, blocking=False)
    with pytest.raises(sk.storage.InjectedFailure):
        pending.wait()
    sk.save(storage, {"x": 1}, step=1)  # the error was reported: not raised again


def test_retention_runs_after_each_background_commit(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path, blocking=False, keep=sk.KeepLatest(2)) as ckpt:
        for step in range(1, 6):
            ckpt.save(step, {"x": step})
        ckpt.wait()
        assert [c.step for c in sk.list_checkpoints(tmp_path)] == [4, 5]


def _staged(original: torch.Tensor) -> set[int]:
    """The data pointers of the live tensors, other than ``original``, that hold a copy of it
    (the writer's staging views: float32, its shape)."""
    gc.collect()
    with warnings.catch_warnings():  # some lazily deprecated objects warn on isinstance
        warnings.simplefilter("ignore")
        return {
            obj.data_ptr()
            for obj in gc.get_objects()
            if isinstance(obj, torch.Tensor)
            and obj is not original
            and obj.dtype == original.dtype
            and obj.shape == original.shape
        }


def test_staging_buffer_is_reused_between_saves() -> None:
    """The Checkpointer's writer keeps its host copy between saves: the second save is staged
    into the same memory as the first (observed through the live tensors, not the writer)."""
    storage = MemoryStorage()
    x = torch.zeros(1013)  # a shape no other live tensor has
    with sk.Checkpointer(storage, blocking=False) as ckpt:
        ckpt.save(1, {"x": x})
        ckpt.wait()
        first = _staged(x)
        assert len(first) == 1, "one staged copy (in one place), kept for the next save"
        x.fill_(1.0)
        ckpt.save(2, {"x": x})
        ckpt.wait()
        assert _staged(x) == first
    assert sk.read(storage, step=2)["x"].eq(1.0).all()
