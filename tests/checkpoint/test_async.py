"""Asynchronous saves: snapshots, one at a time, errors never lost, kills never commit."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.conftest import assert_state_equal
from tests.helpers import launcher
from tests.helpers.saver import state_for

import statekeeper as sk
from statekeeper.storage.memory import MemoryStorage

ROOT = Path(__file__).resolve().parents[2]


def test_staged_values_are_a_snapshot(tmp_path: Path) -> None:
    model = torch.nn.Linear(64, 64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pending = sk.save(tmp_path, {"model": model}, step=1, blocking=False)
    with torch.no_grad():
        model.weight.add_(1.0)  # the training loop goes on at once
    info = pending.wait()
    assert info.step == 1
    assert_state_equal(sk.read(tmp_path)["model"], before)


def test_two_saves_in_a_row_never_interleave() -> None:
    storage = MemoryStorage()
    with sk.Checkpointer(storage, async_save=True) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, {"x": torch.full((1000,), float(step))})
    commits = [i for i, op in enumerate(storage.log) if op.startswith("rename")]
    starts = [i for i, op in enumerate(storage.log) if op.startswith("mkdir")]
    assert len(commits) == len(starts) == 3
    assert starts[1] > commits[0] and starts[2] > commits[1]
    assert [c.step for c in sk.list_checkpoints(storage)] == [1, 2, 3]


def test_a_background_failure_surfaces_on_the_next_call_and_on_close() -> None:
    storage = MemoryStorage()
    ckpt = sk.Checkpointer(storage, async_save=True)
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
    with sk.Checkpointer(tmp_path, async_save=True, keep=sk.KeepLatest(2)) as ckpt:
        for step in range(1, 6):
            ckpt.save(step, {"x": step})
        ckpt.wait()
        assert [c.step for c in sk.list_checkpoints(tmp_path)] == [4, 5]


def test_staging_buffer_is_reused_between_saves() -> None:
    storage = MemoryStorage()
    with sk.Checkpointer(storage, async_save=True) as ckpt:
        ckpt.save(1, {"x": torch.zeros(1000)})
        ckpt.wait()
        buffer = ckpt._writer._staging  # type: ignore[union-attr]
        ckpt.save(2, {"x": torch.ones(1000)})
        ckpt.wait()
        assert ckpt._writer._staging is buffer  # type: ignore[union-attr]


def test_sigkill_during_async_saves_leaves_the_previous_step_loadable(tmp_path: Path) -> None:
    rng = random.Random(7)
    next_step = 0
    for attempt in range(6):
        child = launcher.Popen(  # forked with torch imported: a process of its own all the same
            [sys.executable, "-m", "tests.helpers.saver", str(tmp_path), str(next_step), "async"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        if attempt == 5 and not sk.list_checkpoints(tmp_path):  # a loaded machine: make sure
            for _ in range(2):  # the second save returns once the first is committed
                assert child.stdout.readline().strip().isdigit()
        time.sleep(rng.uniform(0.0, 0.4))  # a random kill instant, not a timing assertion
        child.kill()
        child.wait()
        infos = sk.list_checkpoints(tmp_path)
        if infos:
            saved = sk.read(tmp_path)
            saved.pop("rng")
            assert_state_equal(saved, state_for(infos[-1].step))
            next_step = infos[-1].step + 1
    assert sk.list_checkpoints(tmp_path), "no save committed: the test proved nothing"
