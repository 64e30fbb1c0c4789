"""A save or a load ends no thread of its own (statekeeper/lanes.py): on CPython before
3.12 a thread that ends while another thread forks can leave the child deadlocked
(gh-112275), and a training loop forks its DataLoader workers right after a save. The
hashing and verifying threads are started once and kept; a forked child starts its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import torch

import statekeeper as sk

BIG = {"w": torch.arange(3 << 20, dtype=torch.float32)}  # 12 MiB: hashed and verified in threads


def _helpers() -> dict[int, str]:
    return {
        t.ident or 0: t.name
        for t in threading.enumerate()
        if t.name.startswith(("statekeeper-hash", "statekeeper-verify"))
    }


def test_saves_and_loads_reuse_their_threads_and_end_none(tmp_path: Path) -> None:
    sk.save(tmp_path, BIG, step=1)
    sk.read(tmp_path)
    first = _helpers()
    assert {n.rsplit("_", 1)[0] for n in first.values()} == {
        "statekeeper-hash",
        "statekeeper-verify",
    }
    for step in (2, 3):
        sk.save(tmp_path, BIG, step=step)
        back = sk.read(tmp_path, step=step)
        assert torch.equal(back["w"], BIG["w"])
    assert _helpers() == first  # the same threads, none ended, none added


def test_a_child_forked_after_a_save_saves_and_loads_with_threads_of_its_own(
    tmp_path: Path,
) -> None:
    sk.save(tmp_path / "parent", BIG, step=1)
    sk.read(tmp_path / "parent")
    pid = os.fork()
    if pid == 0:  # the child: the parent's lane threads are not here; new ones start
        code = 1
        try:
            signal.alarm(120)  # a hang guard only: the child dies instead of hanging the test
            torch.set_num_threads(1)  # as a DataLoader worker: torch's own pool is the parent's
            sk.save(tmp_path / "child", BIG, step=1)
            back = sk.read(tmp_path / "child")["w"].numpy()
            code = 0 if (back == BIG["w"].numpy()).all() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [c.step for c in sk.list_checkpoints(tmp_path / "child")] == [1]


EXIT_CHILD = r"""
import sys, torch, statekeeper as sk
big = {"w": torch.arange(6 << 20, dtype=torch.float32)}  # 24 MiB: its chunks are hashed on a lane
pending = sk.save(sys.argv[1], big, step=1, blocking=False)  # kept, never waited
ckpt = sk.Checkpointer(sys.argv[2], blocking=False)  # never closed
ckpt.save(1, big)
"""


def test_interpreter_exit_finishes_background_saves_it_was_not_told_to_wait_for(
    tmp_path: Path,
) -> None:
    """A script that ends right after a one-off ``save(blocking=False)`` (its PendingSave
    kept, never waited for) and a background save of a Checkpointer it never closed: both
    steps are committed. (``concurrent.futures`` refuses work once exit has begun; a save
    whose chunk hashing went through it lost its step at exit, silently.)"""
    done = subprocess.run(
        [sys.executable, "-c", EXIT_CHILD, str(tmp_path / "one-off"), str(tmp_path / "loop")],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for run in ("one-off", "loop"):
        assert [c.step for c in sk.list_checkpoints(tmp_path / run)] == [1], (run, done.stderr)
        assert sk.audit.verify(tmp_path / run).ok
