"""A local tier mirrored to object storage (moto's S3 server on localhost, through s3fs)."""

from __future__ import annotations

import select
import shutil
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import lora_state, lora_step
from tests.helpers import launcher
from tests.helpers.s3 import S3Server

import statekeeper as sk
from statekeeper.loop.mirror import uploader as mirror_module
from statekeeper.storage import fsspec as fsspec_storage


@pytest.fixture
def remote(s3_server: S3Server) -> sk.storage.FsspecStorage:
    return sk.storage.FsspecStorage(f"s3://{s3_server.new_bucket()}/run", **s3_server.options)


@pytest.fixture
def release(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every upload waits until the test sets the event (then goes on as usual)."""
    event = threading.Event()
    # (typing) an internal function the test drives or wraps
    real = mirror_module.upload_step  # type: ignore[attr-defined]

    def held(*args: Any) -> bool:
        event.wait(timeout=120)  # a hang guard only: the test sets it
        return real(*args)

    monkeypatch.setattr(mirror_module, "upload_step", held)
    yield event
    event.set()


def read_line(child: Any) -> str:
    """The child's next line; a hang guard only (the child prints at once): 120 s."""
    ready, _, _ = select.select([child.stdout], [], [], 120)
    if not ready:
        child.kill()
        raise AssertionError("the child printed nothing in 120 s")
    return str(child.stdout.readline()).strip()


def steps(storage: Any) -> list[int]:
    return [i.step for i in sk.list_checkpoints(storage)]


def test_every_committed_step_reaches_the_mirror_byte_for_byte(
    tmp_path: Path, remote: sk.storage.FsspecStorage
) -> None:
    state, adapter, opt = lora_state(width=128)
    with sk.Checkpointer(tmp_path, mirror=sk.Mirror(remote)) as ckpt:
        for step in (1, 2, 3):
            lora_step(adapter, opt)
            ckpt.save(step, state)
        ckpt.wait()
        status = ckpt.mirror_status()
    assert status is not None and status.uploaded == 3 and status.failed == {}
    assert steps(remote) == [1, 2, 3]
    assert sk.audit.verify(remote).ok
    for step in (1, 2, 3):
        entry = f"step_{step:09d}"
        local = (tmp_path / entry / "manifest.json").read_bytes()
        assert remote.read(entry, "manifest.json") == local  # the same manifest, same bytes
    got = sk.read(remote)
    assert torch.equal(got["model"]["adapter.weight"], adapter.weight)


def test_each_tier_keeps_its_own_steps_and_waiting_steps_stay_local(
    tmp_path: Path, remote: sk.storage.FsspecStorage, release: threading.Event
) -> None:
    state, adapter, opt = lora_state(width=128)
    mirror = sk.Mirror(remote, keep=sk.KeepEvery(2))
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), mirror=mirror) as ckpt:
        for step in (1, 2, 3, 4, 5):
            lora_step(adapter, opt)
            ckpt.save(step, state)
        assert steps(tmp_path) == [1, 2, 3, 4, 5]  # none uploaded yet: none deleted
        release.set()
        ckpt.wait()
        lora_step(adapter, opt)
        ckpt.save(6, state)  # retention runs again now that nothing waits
        ckpt.wait()
    assert steps(tmp_path) == [6]
    assert steps(remote) == [2, 4, 6]  # KeepEvery(2) on the mirror, the newest always


def test_a_failed_upload_is_reported_and_the_run_goes_on(
    tmp_path: Path, s3_server: S3Server, remote: sk.storage.FsspecStorage
) -> None:
    remote.fs.retries = 1
    state, adapter, opt = lora_state(width=128)
    mirror = sk.Mirror(remote, retries=3, backoff=0.0)  # retries: stale connections after a restart
    ckpt = sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), mirror=mirror)
    try:
        lora_step(adapter, opt)
        ckpt.save(1, state)
        ckpt.wait()
        s3_server.stop()
        try:
            lora_step(adapter, opt)
            ckpt.save(2, state)  # committed locally at once; its upload fails
            with pytest.raises(sk.errors.MirrorError, match="step 2") as caught:
                ckpt.wait()
            assert caught.value.steps == (2,)
            status = ckpt.mirror_status()
            assert status is not None and list(status.failed) == [2]
        finally:
            s3_server.start()
        lora_step(adapter, opt)
        with pytest.warns(sk.StatekeeperWarning, match="uploading step 2 to s3://"):
            ckpt.save(3, state)  # its upload tries step 2's again first
        ckpt.wait()  # reported once: nothing more to raise
    finally:
        ckpt.close()
    assert steps(tmp_path) == [2, 3]  # step 2 was kept locally until it was uploaded
    assert steps(remote) == [1, 2, 3]  # step 2 made it on its second try
    assert sk.audit.verify(remote).ok


def test_a_transfer_that_fails_once_is_retried(
    tmp_path: Path,
    s3_server: S3Server,
    remote: sk.storage.FsspecStorage,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    remote.fs.retries = 1
    failures: list[str] = []
    real = fsspec_storage._FsspecFiles.write_chunks

    def flaky(self: Any, name: str, chunks: Any) -> None:
        if not failures:
            failures.append(name)
            s3_server.stop()  # the first transfer meets no server
            try:
                real(self, name, chunks)
            finally:
                s3_server.start()  # back for the retry
            return
        real(self, name, chunks)

    monkeypatch.setattr(fsspec_storage._FsspecFiles, "write_chunks", flaky)
    state, adapter, opt = lora_state(width=128)
    mirror = sk.Mirror(remote, backoff=0.0, concurrency=1)  # one file in flight: the one cut
    with sk.Checkpointer(tmp_path, mirror=mirror) as ckpt:
        lora_step(adapter, opt)
        ckpt.save(1, state)
        ckpt.wait()
    assert len(failures) == 1
    assert steps(remote) == [1] and sk.audit.verify(remote).ok


def test_resume_from_the_mirror_when_the_local_tier_is_gone_or_damaged(
    tmp_path: Path, remote: sk.storage.FsspecStorage
) -> None:
    state, adapter, opt = lora_state(width=128)
    with sk.Checkpointer(tmp_path / "node-a", mirror=sk.Mirror(remote)) as ckpt:
        for step in (1, 2):
            lora_step(adapter, opt)
            ckpt.save(step, state)
    saved = {k: v.clone() for k, v in state["model"].state_dict().items()}
    fresh, _, _ = lora_state(width=128)
    with sk.Checkpointer(tmp_path / "node-b", mirror=sk.Mirror(remote)) as ckpt:
        assert ckpt.restore_latest(fresh) == 2  # a new node: downloaded from the mirror
    for key, value in fresh["model"].state_dict().items():
        assert torch.equal(value, saved[key]), key
    shard = tmp_path / "node-a" / "step_000000002" / "tensors-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    again, _, _ = lora_state(width=128)
    with (
        sk.Checkpointer(tmp_path / "node-a", mirror=sk.Mirror(remote)) as ckpt,
        pytest.warns(sk.StatekeeperWarning, match="damaged step 2"),
    ):
        assert ckpt.restore_latest(again) == 2  # the mirror's intact copy of the same step
    for key, value in again["model"].state_dict().items():
        assert torch.equal(value, saved[key]), key


def test_a_damaged_local_file_is_never_uploaded_as_good(
    tmp_path: Path, remote: sk.storage.FsspecStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, adapter, opt = lora_state(width=128)
    # (typing) an internal function the test drives or wraps
    real = mirror_module.upload_step  # type: ignore[attr-defined]

    def damage_first(local: Any, remote: Any, step: int, transfer: Any) -> bool:
        shard = tmp_path / f"step_{step:09d}" / "tensors-00001.safetensors"
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF  # bit rot between the local commit and the upload
        shard.write_bytes(bytes(data))
        return real(local, remote, step, transfer)

    monkeypatch.setattr(mirror_module, "upload_step", damage_first)
    with sk.Checkpointer(tmp_path, mirror=sk.Mirror(remote, backoff=0.0)) as ckpt:
        lora_step(adapter, opt)
        ckpt.save(1, state)
        with pytest.raises(sk.errors.MirrorError) as caught:
            ckpt.wait()
    assert isinstance(caught.value.__cause__, sk.CorruptCheckpointError)
    assert steps(remote) == []


def test_unchanged_files_are_copied_by_the_store_on_the_mirror_too(
    tmp_path: Path, remote: sk.storage.FsspecStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    uploaded: list[str] = []
    real = fsspec_storage._FsspecFiles.write_chunks

    def counted(self: Any, name: str, chunks: Any) -> None:
        uploaded.append(f"{self.entry.split('.')[0]}/{name}")
        real(self, name, chunks)

    monkeypatch.setattr(fsspec_storage._FsspecFiles, "write_chunks", counted)
    state, adapter, opt = lora_state(width=128)
    with sk.Checkpointer(tmp_path, mirror=sk.Mirror(remote)) as ckpt:
        for step in (1, 2):
            lora_step(adapter, opt)
            ckpt.save(step, state)
        ckpt.wait()
    assert "step_000000001/tensors-00000.safetensors" in uploaded
    assert "step_000000002/tensors-00000.safetensors" not in uploaded  # the frozen shard
    assert sk.audit.verify(remote).ok


def test_a_killed_upload_is_resumed_by_the_next_process(
    tmp_path: Path, s3_server: S3Server, remote: sk.storage.FsspecStorage
) -> None:
    child = launcher.Popen(
        [sys.executable, "-m", "tests.helpers.mirror_saver", str(tmp_path), s3_server.endpoint,
         remote.url],
        cwd=launcher.ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert read_line(child) == "mid-upload"
    child.kill()
    child.wait()
    assert steps(tmp_path) == [1, 2]  # both committed locally
    assert steps(remote) == [1]  # step 2's upload was cut: not committed there
    state = {"w": torch.zeros(300_000), "b": torch.zeros(1000)}
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), mirror=sk.Mirror(remote)) as ckpt:
        assert ckpt.restore_latest(state) == 2  # the newest intact step: local
        ckpt.save(3, state)  # local retention keeps step 2: its upload is not done
        ckpt.wait()
    assert steps(remote) == [1, 2, 3]  # the restarted process uploaded the cut step
    assert sk.audit.verify(remote).ok
    assert steps(tmp_path) == [2, 3]  # step 2: resumed from, and waiting at the save


def test_mirror_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(sk.errors.InvalidArgumentError, match="retention policy"):
        sk.Mirror("memory://m", keep=3)
    with pytest.raises(sk.errors.InvalidArgumentError, match="concurrency"):
        sk.Mirror("memory://m", concurrency=0)
    with pytest.raises(sk.errors.InvalidArgumentError, match="backoff"):
        sk.Mirror("memory://m", backoff=-1)
    with pytest.raises(sk.errors.InvalidArgumentError, match=r"statekeeper\.Mirror"):
        sk.Checkpointer(tmp_path, mirror="s3://b/run")
    # values of the right type out of range are the ValueError kind, not the TypeError one
    for bad in ({"timeout": 0}, {"timeout": float("nan")}, {"close_timeout": -1.0}):
        with pytest.raises(sk.errors.InvalidArgumentError, match=next(iter(bad))) as caught:
            sk.Mirror("memory://m", **bad)
        assert not isinstance(caught.value, TypeError)
    with pytest.raises(sk.errors.InvalidArgumentError, match="retries") as caught:
        sk.Mirror("memory://m", retries=-1)
    assert not isinstance(caught.value, TypeError)


def test_a_mirror_on_another_local_disk_works_the_same(tmp_path: Path) -> None:
    state, adapter, opt = lora_state(width=128)
    with sk.Checkpointer(tmp_path / "fast", mirror=sk.Mirror(tmp_path / "slow")) as ckpt:
        for step in (1, 2):
            lora_step(adapter, opt)
            ckpt.save(step, state)
    assert steps(tmp_path / "slow") == [1, 2]
    assert sk.audit.verify(tmp_path / "slow").ok
    shutil.rmtree(tmp_path / "fast")
    fresh, _, _ = lora_state(width=128)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sk.Checkpointer(tmp_path / "fast", mirror=sk.Mirror(tmp_path / "slow")) as ckpt:
            assert ckpt.restore_latest(fresh) == 2


def test_a_preemption_saves_at_once_without_waiting_for_uploads(
    tmp_path: Path, remote: sk.storage.FsspecStorage, release: threading.Event
) -> None:
    import signal

    state, adapter, opt = lora_state(width=128)
    every = sk.EverySteps(100) | sk.OnSignal(signal.SIGUSR1)
    with sk.Checkpointer(tmp_path, every=every, mirror=sk.Mirror(remote)) as ckpt:
        lora_step(adapter, opt)
        ckpt.save(1, state)  # its upload is held
        signal.raise_signal(signal.SIGUSR1)
        lora_step(adapter, opt)
        ckpt.maybe_save(2, state)  # saves now: the held upload does not block it
        assert ckpt.preempted and steps(tmp_path) == [1, 2]
        status = ckpt.mirror_status()
        assert status is not None and status.uploading == 1  # still held: nothing waited
        fresh, _, _ = lora_state(width=128)
        assert ckpt.restore_latest(fresh) == 2  # a resume does not wait for uploads either
        status = ckpt.mirror_status()
        assert status is not None and status.uploading == 1
        release.set()
    assert steps(remote) == [1, 2]  # close() waited for both uploads


def test_background_saves_with_a_mirror(tmp_path: Path, remote: sk.storage.FsspecStorage) -> None:
    state, adapter, opt = lora_state(width=128)
    with sk.Checkpointer(tmp_path, blocking=False, mirror=sk.Mirror(remote)) as ckpt:
        for step in (1, 2, 3):
            lora_step(adapter, opt)
            ckpt.save(step, state)
        ckpt.wait()
    assert steps(remote) == [1, 2, 3] and sk.audit.verify(remote).ok


def test_an_unreachable_mirror_does_not_stop_a_resume(
    tmp_path: Path, s3_server: S3Server, remote: sk.storage.FsspecStorage
) -> None:
    state, adapter, opt = lora_state(width=128)
    with sk.Checkpointer(tmp_path, mirror=sk.Mirror(remote)) as ckpt:
        lora_step(adapter, opt)
        ckpt.save(1, state)
    remote.fs.retries = 1
    s3_server.stop()
    try:
        fresh, _, _ = lora_state(width=128)
        with (
            pytest.warns(sk.StatekeeperWarning, match="cannot list"),
            sk.Checkpointer(tmp_path, mirror=sk.Mirror(remote, retries=0)) as ckpt,
        ):
            assert ckpt.restore_latest(fresh) == 1  # the local tier alone
    finally:
        s3_server.start()


class _BrokenPolicy(sk.KeepLatest):
    def keep(self, checkpoints: Any) -> set[int]:
        raise ValueError("a bug in a retention policy (injected)")


def test_a_mirror_retention_policy_that_fails_neither_hangs_nor_loses_the_upload(
    tmp_path: Path, remote: sk.storage.FsspecStorage
) -> None:
    state, adapter, opt = lora_state(width=128)
    mirror = sk.Mirror(remote, keep=_BrokenPolicy(1))
    with sk.Checkpointer(tmp_path, mirror=mirror) as ckpt:
        for step in (1, 2):
            lora_step(adapter, opt)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ckpt.save(step, state)
                ckpt.wait()  # returns: the uploader thread survived the policy's error
            assert any("retention on the mirror" in str(w.message) for w in caught)
    assert steps(remote) == [1, 2]
