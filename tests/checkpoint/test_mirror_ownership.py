"""Who may touch a run's upload journal and its mirror: only the Checkpointer that holds the
run's writer lock, and only until its uploader is halted (moto's S3 server behind the
proxy of tests/helpers/s3.py, which can hold a request in flight)."""

from __future__ import annotations

import json
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import launcher
from tests.helpers.s3 import FaultyProxy, S3Server

import statekeeper as sk

HANG_GUARD = 120.0
"""Seconds a thread that must end is waited for (a hang guard, never a verdict on speed)."""


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.new_bucket()


@pytest.fixture
def proxy(s3_server: S3Server) -> FaultyProxy:
    return FaultyProxy(s3_server.port)


def direct(s3_server: S3Server, bucket: str) -> sk.storage.FsspecStorage:
    return sk.storage.FsspecStorage(f"s3://{bucket}/run", **s3_server.options)


def through(proxy: FaultyProxy, bucket: str) -> sk.storage.FsspecStorage:
    storage = sk.storage.FsspecStorage(f"s3://{bucket}/run", **proxy.options)
    storage.fs.retries = 1
    return storage


def steps(storage: Any) -> list[int]:
    return [i.step for i in sk.list_checkpoints(storage)]


def test_a_checkpointer_refused_by_the_lock_touches_neither_journal_nor_mirror(
    tmp_path: Path, proxy: FaultyProxy, bucket: str
) -> None:
    run = tmp_path / "run"
    with sk.Checkpointer(run) as first:
        first.save(1, {"w": torch.ones(3)})
    journal = run / ".statekeeper-uploads.json"
    waiting = {"format": "statekeeper-uploads", "version": 1, "mirrors": {}}
    waiting["mirrors"] = {f"s3://{bucket}/run": [1, 7]}  # 7: no longer on the local tier
    journal.write_text(json.dumps(waiting))
    before = journal.read_bytes()
    holder = sk.Checkpointer(run)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # not even a word about the journal's steps
            with pytest.raises(sk.errors.WriterConflictError):
                sk.Checkpointer(run, mirror=sk.Mirror(through(proxy, bucket)))
    finally:
        holder.close()
    assert journal.read_bytes() == before
    assert proxy.requests == []  # the mirror was never asked anything


def test_an_uploader_halted_by_close_never_writes_the_journal_nor_the_mirror_again(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    run = tmp_path / "run"
    # step 1's commit check (after its manifest is written), held until released
    hold = proxy.hold_next(f"HEAD /{bucket}/run/step_000000001/manifest.json")
    mirror = sk.Mirror(
        through(proxy, bucket), keep=sk.KeepLatest(1), timeout=HANG_GUARD, close_timeout=0.5
    )
    before = set(threading.enumerate())
    ckpt = sk.Checkpointer(run, mirror=mirror)
    ckpt.save(1, {"w": torch.ones(1000)})
    ckpt.save(2, {"w": torch.full((1000,), 2.0)})
    assert hold.reached.wait(HANG_GUARD)
    names = ("statekeeper-mirror", "statekeeper-upload")  # this uploader's threads
    uploading = [t for t in set(threading.enumerate()) - before if t.name in names]
    assert uploading
    with pytest.warns(sk.StatekeeperWarning, match=r"close_timeout=0.5.*steps \[1, 2\]"):
        ckpt.close()  # halts the uploader and releases the writer lock
    journal = run / ".statekeeper-uploads.json"
    assert json.loads(journal.read_text())["mirrors"] == {f"s3://{bucket}/run": [1, 2]}
    # the next owner of the run uploads what was left, and a step of its own (no retention)
    with sk.Checkpointer(run, mirror=sk.Mirror(direct(s3_server, bucket))) as again:
        again.save(3, {"w": torch.full((1000,), 3.0)})
        again.wait()
    after = journal.read_bytes()
    assert json.loads(after)["mirrors"] == {}
    assert steps(direct(s3_server, bucket)) == [1, 2, 3]
    hold.release()  # the halted uploader's request is answered now
    for thread in uploading:
        thread.join(HANG_GUARD)
        assert not thread.is_alive()
    assert journal.read_bytes() == after  # never written by the halted uploader
    # nor its mirror retention run (KeepLatest(1) after step 1 would delete step 2 now)
    assert steps(direct(s3_server, bucket)) == [1, 2, 3]


@pytest.mark.parametrize("how", ["close", "exit"])
def test_a_mirror_that_hangs_for_ever_never_holds_the_process_at_exit(
    tmp_path: Path, how: str
) -> None:
    run = tmp_path / "run"
    done = launcher.run(
        [sys.executable, "-m", "tests.helpers.mirror_hang", str(run), how],
        cwd=launcher.ROOT, capture_output=True, text=True, timeout=HANG_GUARD / 2,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == (["saved", "closed"] if how == "close" else ["saved"])
    assert "StatekeeperWarning" in done.stderr
    assert "close_timeout=1" in done.stderr and "steps [1, 2]" in done.stderr, done.stderr
    assert "upload journal" in done.stderr
    journal = json.loads((run / ".statekeeper-uploads.json").read_text())
    assert journal["mirrors"] == {"hang://mirror/run": [1, 2]}  # resumed by the next process


def test_a_save_never_waits_for_the_mirror_retention_in_progress(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    run = tmp_path / "run"
    # the removal of step 1 by the mirror's retention (after step 2 is uploaded), held
    hold = proxy.hold_next(f"DELETE /{bucket}/run/step_000000001/manifest.json")
    mirror = sk.Mirror(through(proxy, bucket), keep=sk.KeepLatest(1), timeout=HANG_GUARD)
    ckpt = sk.Checkpointer(run, mirror=mirror)
    try:
        ckpt.save(1, {"w": torch.ones(10)})
        ckpt.save(2, {"w": torch.full((10,), 2.0)})
        assert hold.reached.wait(HANG_GUARD)  # the retention is in flight now
        saved = threading.Event()

        def save() -> None:
            ckpt.save(3, {"w": torch.full((10,), 3.0)})  # records step 3 in the journal
            saved.set()

        saver = threading.Thread(target=save)
        saver.start()
        saver.join(HANG_GUARD)  # a hang guard: the save must not wait for the held request
        assert saved.is_set(), "the save waited for the mirror's retention"
        journal = json.loads((run / ".statekeeper-uploads.json").read_text())
        assert 3 in journal["mirrors"][f"s3://{bucket}/run"]
    finally:
        hold.release()
        ckpt.close()
    assert steps(direct(s3_server, bucket)) == [3]
