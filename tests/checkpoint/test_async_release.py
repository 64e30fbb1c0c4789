"""A one-off background save frees its host copy once the step is written, failed or not;
its own ``PendingSave`` reports the failure once (tests/checkpoint/test_pending.py)."""

from __future__ import annotations

import gc
import os
import signal
import threading
import warnings
from pathlib import Path

import pytest
import torch

import statekeeper as sk
from statekeeper.storage.memory import MemoryStorage

ODD = 12_347  # a size no other tensor of the test process has


def _staged_copies(original: torch.Tensor) -> list[torch.Tensor]:
    gc.collect()
    with warnings.catch_warnings():  # some lazily deprecated objects warn on isinstance
        warnings.simplefilter("ignore")
        return [
            obj
            for obj in gc.get_objects()
            if isinstance(obj, torch.Tensor) and obj.numel() == ODD and obj is not original
        ]


@pytest.mark.parametrize("fails", [False, True])
def test_the_staging_copy_is_freed_once_written(fails: bool) -> None:
    x = torch.arange(ODD, dtype=torch.float32)
    storage = MemoryStorage(name=f"memory://release-{fails}")
    if fails:
        storage.fail_at = storage.operations + 3
    pending = sk.save(storage, {"x": x}, step=1, blocking=False)
    if fails:
        with pytest.raises(sk.storage.InjectedFailure) as caught:
            pending.wait()
        assert caught.value.__traceback__ is not None  # the traceback is kept for the user
    else:
        pending.wait()
    assert _staged_copies(x) == []
    sk.save(storage, {"x": x}, step=2, blocking=False).wait()  # reported once: not again
    assert _staged_copies(x) == []


def test_background_saves_to_an_fsspec_url_release_the_lock_from_the_writing_thread(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path / 'run'}"
    x = torch.arange(4.0)
    sk.save(url, {"x": x}, step=1, blocking=False).wait()
    sk.save(url, {"x": x}, step=2, blocking=False).wait()  # the lock was released
    with sk.Checkpointer(url, blocking=False) as ckpt:
        ckpt.save(3, {"x": x})
    assert [c.step for c in sk.list_checkpoints(url)] == [1, 2, 3]


def _save_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("statekeeper-save")]


def test_a_checkpointer_keeps_one_writing_thread_until_it_is_closed(tmp_path: Path) -> None:
    before = set(_save_threads())
    state = {"x": torch.arange(8.0)}
    with sk.Checkpointer(tmp_path / "run", blocking=False) as ckpt:
        seen = []
        for step in (1, 2, 3):
            ckpt.save(step, state).wait()
            seen.append(set(_save_threads()) - before)
        assert len(seen[0]) == 1 and seen[0] == seen[1] == seen[2]  # one thread, reused
        (thread,) = seen[0]
    assert not thread.is_alive()  # close() stopped it
    assert [c.step for c in sk.list_checkpoints(tmp_path / "run")] == [1, 2, 3]


def test_one_off_background_saves_start_and_end_no_thread_of_their_own(tmp_path: Path) -> None:
    """A one-off save runs on the process's save lane (statekeeper/lanes.py): no thread is
    started or ended per save, as one ending while the loop forks can hang the child."""
    sk.save(tmp_path / "run", {"x": torch.ones(3)}, step=1, blocking=False).wait()
    threads = set(_save_threads())
    assert threads and all(t.is_alive() for t in threads)
    for step in (2, 3, 4):
        sk.save(tmp_path / "run", {"x": torch.ones(3)}, step=step, blocking=False).wait()
        assert set(_save_threads()) == threads
    assert [c.step for c in sk.list_checkpoints(tmp_path / "run")] == [1, 2, 3, 4]


def test_a_failing_clean_up_is_reported_not_a_wait_that_hangs() -> None:
    from statekeeper.checkpoint.async_save import AsyncWriter

    writer = AsyncWriter()
    info = sk.CheckpointInfo(step=1, path="memory://x/step_1", bytes=0, created=None)

    def cleanup() -> None:
        raise OSError(5, "could not remove the in-progress entry (injected)")

    pending = writer._background("memory://x", 1, lambda: info, cleanup)
    with pytest.raises(OSError, match="in-progress entry"):
        pending.wait()
    writer.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX only")
def test_a_forked_child_saves_with_a_thread_of_its_own(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path / "run", blocking=False) as ckpt:
        ckpt.save(1, {"x": torch.ones(3)}).wait()  # the parent's writer thread runs
        pid = os.fork()
        if pid == 0:  # the child: its writer must not hand work to the parent's thread
            code = 1
            signal.alarm(120)  # a hang guard only: a hung child dies instead of the run
            try:
                ckpt.save(2, {"x": torch.ones(3)}).wait()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [c.step for c in sk.list_checkpoints(tmp_path / "run")] == [1, 2]
