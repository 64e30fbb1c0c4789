"""Retention never fails a committed save: a step it cannot remove is warned about, retried
at every later save and reported by ``Checkpointer.retention_status()``."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import statekeeper as sk

STEP_1 = "step_000000001"


def _steps(run: Path) -> list[int]:
    return [i.step for i in sk.list_checkpoints(run)]


@contextmanager
def _immutable(path: Path) -> Iterator[None]:
    """``path`` with the immutable attribute (``chattr +i``): a real failure of its rename
    (``EPERM``), which root cannot bypass. Skips where the tool or the file system lacks it."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("chattr is not installed")
    made = subprocess.run([chattr, "+i", str(path)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not possible here: {made.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


@pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "background"])
def test_an_immutable_step_fails_no_save(tmp_path: Path, async_save: bool) -> None:
    state = {"w": torch.ones(8)}
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), blocking=not async_save) as ckpt:

        def save(step: int) -> sk.CheckpointInfo:
            done = ckpt.save(step, state)
            return done if isinstance(done, sk.CheckpointInfo) else done.wait()

        save(1)
        with _immutable(tmp_path / STEP_1):
            with pytest.warns(sk.StatekeeperWarning, match="could not remove step 1") as caught:
                assert save(2).step == 2  # committed, and reported as saved
            message = str(caught[0].message)
            assert "Operation not permitted" in message and "Step 2 is saved" in message
            (pending,) = ckpt.retention_status().pending
            assert pending.step == 1 and pending.path.endswith(STEP_1)
            assert "Operation not permitted" in pending.reason
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the same failure is not warned again
                assert save(3).step == 3
            assert [p.step for p in ckpt.retention_status().pending] == [1]  # 2 went
            assert _steps(tmp_path) == [1, 3]
        assert save(4).step == 4  # removable again: retried, and gone
        assert ckpt.retention_status().ok
        assert ckpt.retention_status().pending == ()
    assert _steps(tmp_path) == [4]


def test_a_mount_point_step_busy_fails_no_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step directory that is a mount point: its rename fails with ``EBUSY``. Injected:
    ``os.rename`` raises ``OSError(EBUSY)`` for that one directory only (a real mount needs
    privileges a test run may lack); everything else is real."""
    state = {"w": torch.ones(8)}
    busy = str(tmp_path / STEP_1)
    real_rename = os.rename

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if os.fspath(src) == busy:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), busy)
        real_rename(src, dst)

    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1)) as ckpt:
        ckpt.save(1, state)
        monkeypatch.setattr(os, "rename", rename)
        with pytest.warns(sk.StatekeeperWarning, match="could not remove step 1.*busy"):
            assert ckpt.save(2, state).step == 2
        assert [p.step for p in ckpt.retention_status().pending] == [1]
        monkeypatch.undo()
        ckpt.save(3, state)
        assert ckpt.retention_status().ok
    assert _steps(tmp_path) == [3]
