"""Run directories on a real S3 protocol: moto's server on localhost, spoken to by s3fs."""

from __future__ import annotations

import select
import subprocess
import sys
from typing import Any

import pytest
import torch
from tests.conftest import lora_state, lora_step
from tests.helpers import launcher
from tests.helpers.s3 import S3Server

import statekeeper as sk
from statekeeper.storage import fsspec as fsspec_storage

ROOT = launcher.ROOT


@pytest.fixture
def run(s3_server: S3Server) -> tuple[str, dict[str, Any]]:
    """A run directory in a bucket of its own, and the storage options that reach it."""
    return f"s3://{s3_server.new_bucket()}/run", s3_server.options


def test_saves_lists_verifies_and_loads_through_s3(run: tuple[str, dict[str, Any]]) -> None:
    url, options = run
    storage = sk.storage.FsspecStorage(url, **options)
    state, adapter, opt = lora_state(width=128)
    with sk.Checkpointer(storage, keep=sk.KeepLatest(2)) as ckpt:
        for s in (1, 2, 3):
            lora_step(adapter, opt)
            ckpt.save(s, state, metrics={"loss": 1.0 / s})
    assert [i.step for i in sk.list_checkpoints(storage)] == [2, 3]  # retention on S3
    assert sk.audit.verify(storage).ok
    fresh, fresh_adapter, fresh_opt = lora_state(width=128)
    lora_step(fresh_adapter, fresh_opt)
    with sk.Checkpointer(sk.storage.FsspecStorage(url, **options)) as ckpt:
        assert ckpt.restore_latest(fresh) == 3
    for a, b in zip(
        fresh["model"].state_dict().values(), state["model"].state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)


def test_an_unchanged_file_is_copied_by_the_server_not_uploaded(
    run: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, options = run
    storage = sk.storage.FsspecStorage(url, **options)
    state, adapter, opt = lora_state(width=128)
    lora_step(adapter, opt)
    sk.save(storage, state, step=1)
    uploaded: list[str] = []
    real = fsspec_storage._FsspecFiles.write_chunks

    def counted(self: Any, name: str, chunks: Any) -> None:
        uploaded.append(name)
        real(self, name, chunks)

    monkeypatch.setattr(fsspec_storage._FsspecFiles, "write_chunks", counted)
    lora_step(adapter, opt)
    info = sk.save(storage, state, step=2)
    assert info.reused_files == 1
    assert "tensors-00000.safetensors" not in uploaded  # the frozen shard: CopyObject
    assert sk.audit.verify(storage).ok
    got = sk.read(storage)
    assert torch.equal(got["model"]["base.weight"], state["model"].base.weight)
    assert torch.equal(got["model"]["adapter.weight"], adapter.weight)


def test_a_killed_upload_leaves_the_previous_step_and_a_partial_one(
    s3_server: S3Server, run: tuple[str, dict[str, Any]]
) -> None:
    url, options = run
    child = launcher.Popen(
        [sys.executable, "-m", "tests.helpers.s3_saver", s3_server.endpoint, url],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], 120)  # a hang guard only
    assert ready, "the child printed nothing in 120 s"
    assert child.stdout.readline().strip() == "mid-upload"
    child.kill()
    child.wait()
    storage = sk.storage.FsspecStorage(url, **options)
    assert [i.step for i in sk.list_checkpoints(storage)] == [1]
    assert [p.step for p in sk.audit.list_partial(storage)] == [2]
    live = {"w": torch.zeros(300_000), "b": torch.zeros(1000)}
    assert sk.load(storage, live).step == 1  # the newest intact step
    assert torch.equal(live["w"], torch.arange(300_000, dtype=torch.float32))
    sk.audit.remove_partial(storage)
    assert sk.audit.list_partial(storage) == []
    sk.save(storage, live, step=2)  # the run goes on
    assert [i.step for i in sk.list_checkpoints(storage)] == [1, 2]


def test_a_server_restart_mid_upload_fails_that_save_only(
    s3_server: S3Server, run: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, options = run
    storage = sk.storage.FsspecStorage(url, **options)
    storage.fs.retries = 1  # s3fs's own retries would only make the failure slower
    state = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(1000)}
    sk.save(storage, state, step=1, shard_bytes=500_000)
    real = fsspec_storage._FsspecFiles.write_chunks
    restarts: list[str] = []

    def down_after_first(self: Any, name: str, chunks: Any) -> None:
        real(self, name, chunks)
        if not restarts:
            restarts.append(name)
            s3_server.stop()  # every later request of this save finds no server

    monkeypatch.setattr(fsspec_storage._FsspecFiles, "write_chunks", down_after_first)
    state["w"] += 1
    try:
        with pytest.raises(sk.StatekeeperError):
            sk.save(storage, state, step=2, shard_bytes=500_000)
    finally:
        s3_server.start()  # back, with what it stored
    monkeypatch.setattr(fsspec_storage._FsspecFiles, "write_chunks", real)
    fresh = sk.storage.FsspecStorage(url, **options)
    assert [i.step for i in sk.list_checkpoints(fresh)] == [1]  # step 2 never committed
    assert sk.read(fresh)["w"][0] == 0.0
    sk.save(fresh, state, step=2, shard_bytes=500_000)
    assert sk.audit.verify(fresh).ok
    assert sk.read(fresh)["w"][0] == 1.0
