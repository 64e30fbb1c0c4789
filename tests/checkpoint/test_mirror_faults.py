"""The mirror tier when the network fails: moto's S3 server behind a proxy on localhost that
cuts, corrupts or never answers requests (tests/helpers/s3.py), kills mid-upload, and
processes that exit without close()."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import lora_state, lora_step
from tests.helpers import launcher
from tests.helpers.s3 import FaultyProxy, S3Server

import statekeeper as sk

HANG_GUARD = 120.0
"""Seconds a call that must return is waited for (a hang guard only, never a verdict on
speed: the calls here return after a few ``Mirror.timeout`` seconds)."""


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.new_bucket()


@pytest.fixture
def proxy(s3_server: S3Server) -> FaultyProxy:
    return FaultyProxy(s3_server.port)


def steps(storage: Any) -> list[int]:
    return [i.step for i in sk.list_checkpoints(storage)]


def failing(arm: Callable[[str], None], match: str) -> None:
    """One failure of a request as the mirror sees it: ``FAULTS`` in a row on the wire,
    more than the client stack sends a request by itself (aiohttp and aiobotocore send one
    up to three times here), fewer than the mirror's retries (``RETRIES``) send it."""
    for _ in range(FAULTS):
        arm(match)


FAULTS = 4
RETRIES = 5


def direct(s3_server: S3Server, bucket: str) -> sk.storage.FsspecStorage:
    return sk.storage.FsspecStorage(f"s3://{bucket}/run", **s3_server.options)


def through(proxy: FaultyProxy, bucket: str) -> sk.storage.FsspecStorage:
    """The run through the proxy, by a client that does not retry on its own (s3fs's retry
    loop off, as botocore's): a fault the proxy injects is the one the mirror sees."""
    storage = sk.storage.FsspecStorage(f"s3://{bucket}/run", **proxy.options)
    storage.fs.retries = 1
    return storage


def returns(call: Callable[[], Any]) -> Any:
    """``call()``'s result, or its exception raised here; fails the test when it has not
    returned after ``HANG_GUARD`` seconds."""
    out: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD)
    assert not thread.is_alive(), f"still blocked after {HANG_GUARD:g} s"
    if failure:
        raise failure[0]
    return out[0] if out else None


def two_steps_uploaded(tmp_path: Path, remote: sk.storage.FsspecStorage) -> dict[str, torch.Tensor]:
    """Steps 1 and 2 on both tiers (``tmp_path / "node-a"``); step 2's model state."""
    state, adapter, opt = lora_state(width=128)
    with sk.Checkpointer(tmp_path / "node-a", mirror=sk.Mirror(remote)) as ckpt:
        for step in (1, 2):
            lora_step(adapter, opt)
            ckpt.save(step, state)
    return {k: v.clone() for k, v in state["model"].state_dict().items()}


def assert_model(state: dict[str, Any], saved: dict[str, torch.Tensor]) -> None:
    for key, value in state["model"].state_dict().items():
        assert torch.equal(value, saved[key]), key


def test_one_failed_listing_of_the_mirror_never_restarts_the_run(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    saved = two_steps_uploaded(tmp_path, direct(s3_server, bucket))
    failing(proxy.cut_next, "list-type=2")  # the mirror's listing: connections reset
    fresh, _, _ = lora_state(width=128)
    mirror = sk.Mirror(through(proxy, bucket), retries=RETRIES, backoff=0.0)
    with sk.Checkpointer(tmp_path / "node-b", mirror=mirror) as ckpt:  # a new node
        assert ckpt.restore_latest(fresh) == 2
    assert_model(fresh, saved)


def test_a_mirror_that_cannot_be_listed_is_an_error_not_an_empty_run(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    two_steps_uploaded(tmp_path, direct(s3_server, bucket))
    proxy.down()
    fresh, _, _ = lora_state(width=128)
    mirror = sk.Mirror(through(proxy, bucket), retries=1, backoff=0.0)
    with sk.Checkpointer(tmp_path / "node-b", mirror=mirror) as ckpt:
        with pytest.raises(sk.errors.MirrorError, match="not started from scratch"):
            ckpt.restore_latest(fresh)  # never None: a fresh start would lose the run
        proxy.up()
        assert ckpt.restore_latest(fresh) == 2


def test_one_failed_download_of_the_newest_step_is_retried_not_skipped(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    saved = two_steps_uploaded(tmp_path, direct(s3_server, bucket))
    failing(proxy.cut_next, "step_000000002/tensors-00001")
    fresh, _, _ = lora_state(width=128)
    mirror = sk.Mirror(through(proxy, bucket), retries=RETRIES, backoff=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing skipped
        with sk.Checkpointer(tmp_path / "node-b", mirror=mirror) as ckpt:
            assert ckpt.restore_latest(fresh) == 2
    assert_model(fresh, saved)


def test_a_download_corrupted_in_transit_is_downloaded_again(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    saved = two_steps_uploaded(tmp_path, direct(s3_server, bucket))
    failing(proxy.corrupt_next, "GET /" + bucket + "/run/step_000000002/tensors-00001")
    fresh, _, _ = lora_state(width=128)  # one bit of each answer flipped
    mirror = sk.Mirror(through(proxy, bucket), retries=RETRIES, backoff=0.0)
    with sk.Checkpointer(tmp_path / "node-b", mirror=mirror) as ckpt:
        assert ckpt.restore_latest(fresh) == 2
    assert_model(fresh, saved)


def test_a_newest_step_the_mirror_cannot_deliver_is_not_replaced_by_an_older_one(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    two_steps_uploaded(tmp_path, direct(s3_server, bucket))
    for _ in range(20):  # more than every try of the download
        proxy.cut_next("step_000000002/tensors-00001")
    fresh, _, _ = lora_state(width=128)
    mirror = sk.Mirror(through(proxy, bucket), retries=1, backoff=0.0)
    with (
        sk.Checkpointer(tmp_path / "node-b", mirror=mirror) as ckpt,
        pytest.raises(sk.errors.MirrorError, match="step 2") as caught,
    ):
        ckpt.restore_latest(fresh)  # never step 1 in its place
    assert caught.value.steps == (2,)


def test_a_hung_mirror_does_not_hold_a_resume_that_has_local_steps(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    saved = two_steps_uploaded(tmp_path, direct(s3_server, bucket))
    proxy.hang()  # accepts connections, never answers
    fresh, _, _ = lora_state(width=128)
    mirror = sk.Mirror(through(proxy, bucket), timeout=1.0)
    ckpt = sk.Checkpointer(tmp_path / "node-a", mirror=mirror)
    try:
        with pytest.warns(sk.StatekeeperWarning, match=r"cannot list the mirror .* within 1 s"):
            assert returns(lambda: ckpt.restore_latest(fresh)) == 2  # the local tier's
    finally:
        returns(ckpt.close)  # nothing queued: the hung peer is not waited for
    assert_model(fresh, saved)


def test_close_with_a_hung_mirror_returns_and_the_next_process_uploads_the_step(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    state, adapter, opt = lora_state(width=128)
    mirror = sk.Mirror(through(proxy, bucket), timeout=1.0, retries=1, backoff=0.0)
    ckpt = sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), mirror=mirror)
    lora_step(adapter, opt)
    ckpt.save(1, state)
    ckpt.wait()
    proxy.hang()
    lora_step(adapter, opt)
    ckpt.save(2, state)
    with pytest.raises(sk.errors.MirrorError, match="step 2"):
        returns(ckpt.close)  # bounded: each request gives up after Mirror.timeout
    assert steps(direct(s3_server, bucket)) == [1]
    lora_step(adapter, opt)
    mirror = sk.Mirror(direct(s3_server, bucket))
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), mirror=mirror) as ckpt:
        ckpt.save(3, state)  # step 2 is still waiting: local retention keeps it
        assert 2 in steps(tmp_path)
    assert steps(direct(s3_server, bucket)) == [1, 2, 3]  # from the journal


def test_close_waits_at_most_close_timeout_and_names_what_is_left(
    tmp_path: Path, s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statekeeper.loop.mirror import uploader

    release = threading.Event()
    # (typing) an internal function the test drives or wraps
    real = uploader.upload_step  # type: ignore[attr-defined]

    def held(*args: Any) -> bool:
        release.wait(HANG_GUARD)  # a slow upload that never ends by itself
        return real(*args)

    monkeypatch.setattr(uploader, "upload_step", held)
    state, adapter, opt = lora_state(width=128)
    mirror = sk.Mirror(direct(s3_server, bucket), close_timeout=0.5)
    ckpt = sk.Checkpointer(tmp_path, mirror=mirror)
    lora_step(adapter, opt)
    ckpt.save(1, state)
    ckpt.save(2, state)
    with pytest.warns(sk.StatekeeperWarning, match=r"close_timeout=0.5.*steps \[1, 2\]"):
        returns(ckpt.close)
    release.set()
    monkeypatch.setattr(uploader, "upload_step", real)
    with sk.Checkpointer(tmp_path, mirror=sk.Mirror(direct(s3_server, bucket))) as again:
        again.wait()
    assert steps(direct(s3_server, bucket)) == [1, 2]


def test_a_keep_every_step_cut_by_a_kill_survives_on_a_tier(
    tmp_path: Path, s3_server: S3Server, bucket: str
) -> None:
    remote = direct(s3_server, bucket)
    child = launcher.Popen(
        [sys.executable, "-m", "tests.helpers.mirror_saver", str(tmp_path), s3_server.endpoint,
         remote.url, "5"],
        cwd=launcher.ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "mid-upload"  # printed at once
    child.kill()
    child.wait()
    assert steps(remote) == [4]  # KeepEvery(5) and the newest; step 5's upload was cut
    state = {"w": torch.zeros(300_000), "b": torch.zeros(1000)}
    mirror = sk.Mirror(remote, keep=sk.KeepEvery(5))
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), mirror=mirror, shard_bytes=500_000) as c:
        assert c.restore_latest(state) == 5
        for step in (6, 7):
            c.save(step, state)
            c.wait()
    assert 5 in steps(remote) or 5 in steps(tmp_path)
    assert steps(remote) == [5, 7]  # KeepEvery(5) kept the step the kill had cut
    assert steps(tmp_path) == [5, 7]  # 5: the step resumed from


def test_a_script_that_ends_without_close_finishes_its_uploads(
    tmp_path: Path, s3_server: S3Server, bucket: str
) -> None:
    remote = direct(s3_server, bucket)
    done = launcher.run(
        [sys.executable, "-m", "tests.helpers.mirror_exit", str(tmp_path), s3_server.endpoint,
         remote.url],
        cwd=launcher.ROOT, capture_output=True, text=True, timeout=HANG_GUARD,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert steps(tmp_path) == [1, 2, 3]
    assert steps(remote) == [1, 2, 3], done.stderr
    assert sk.audit.verify(remote).ok


def test_a_step_another_process_commits_is_seen_by_a_process_that_listed_before(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsspec.config

    url = f"s3://{bucket}/run"
    cached = {k: v for k, v in s3_server.options.items() if k != "skip_instance_cache"}
    monkeypatch.setitem(fsspec.config.conf, "s3", cached)  # plain URLs reach the server
    state = {"w": torch.zeros(1000)}
    sk.save(url, state, step=1)
    assert steps(url) == [1]  # listed once, through fsspec's cached file system
    reader = sk.storage.FsspecStorage(url)
    assert steps(reader) == [1]
    writer = sk.storage.FsspecStorage(url, **s3_server.options)  # another client: another process
    sk.save(writer, {"w": torch.ones(1000)}, step=2)
    assert steps(url) == [1, 2]
    assert steps(reader) == [1, 2]
    live = {"w": torch.zeros(1000)}
    assert sk.load(url, live).step == 2 and torch.equal(live["w"], torch.ones(1000))


def test_junk_prefixes_beside_the_steps_cost_no_request_of_their_own(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    saved = two_steps_uploaded(tmp_path, direct(s3_server, bucket))
    fs = s3_server.filesystem()
    for i in range(100):
        fs.pipe_file(f"{bucket}/run/other-{i:03d}/notes.txt", b"not a step")
    fresh, _, _ = lora_state(width=128)
    with sk.Checkpointer(tmp_path / "node-b", mirror=sk.Mirror(through(proxy, bucket))) as ckpt:
        assert ckpt.restore_latest(fresh) == 2
    assert_model(fresh, saved)
    assert not any("other-" in r for r in proxy.requests)  # none asked about on its own
    listings = [r for r in proxy.requests if "list-type=2" in r]
    assert len(listings) < 10, listings  # a few listings of the whole run, not one per prefix


def test_a_mirror_that_is_the_run_directory_under_another_spelling_is_refused(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "link").symlink_to(run)
    spellings: list[Any] = [
        str(run),
        f"{run}/../run",
        tmp_path / "link",
        f"file://{run}",
        f"file://{tmp_path}/./run/",
        os.path.relpath(run),
    ]
    for spelling in spellings:
        with pytest.raises(sk.errors.InvalidArgumentError, match="is the run directory"):
            sk.Checkpointer(run, mirror=sk.Mirror(spelling))
    with sk.Checkpointer(run, mirror=sk.Mirror(tmp_path / "elsewhere")) as ckpt:
        assert ckpt.mirror_status() is not None
