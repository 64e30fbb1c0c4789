"""The upload journal under a save racing the uploader thread's own journal write."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import statekeeper as sk
from statekeeper.catalog import journal as journal_module


def test_a_step_submitted_while_the_thread_writes_the_journal_stays_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread computes "nothing waits" after step 1's upload; step 2 is saved before
    it writes that: the journal must still list step 2 (a kill now must not lose it)."""
    run, mirror = tmp_path / "run", tmp_path / "mirror"
    state = {"w": torch.zeros(3)}
    ckpt = sk.Checkpointer(run, mirror=sk.Mirror(mirror))
    real = journal_module.Journal.write
    stale_written, release = threading.Event(), threading.Event()
    thread_writes = 0

    def write(self: Any, steps: set[int]) -> None:
        nonlocal thread_writes
        if threading.current_thread().name != "statekeeper-mirror":
            real(self, steps)
            return
        thread_writes += 1
        if thread_writes == 1:  # step 1 done, "nothing waits": hold it until step 2 queues
            for _ in range(12000):  # a hang guard only
                status = ckpt.mirror_status()
                if status is not None and 2 in status.waiting:
                    break
                threading.Event().wait(0.01)
            real(self, steps)
            stale_written.set()
        else:  # no later write until the test has read the journal
            release.wait(timeout=120)
            real(self, steps)

    monkeypatch.setattr(journal_module.Journal, "write", write)
    try:
        ckpt.save(1, state)
        ckpt.save(2, state)
        assert stale_written.wait(timeout=120)
        data = json.loads((run / journal_module.JOURNAL).read_text())
        assert [2 in steps for steps in data["mirrors"].values()] == [True]  # its one mirror
    finally:
        release.set()
        ckpt.close()
