"""What deciding the newest step of a mirror costs: one listing of the run's top level and
one request for the step loaded, whatever the steps hold (moto's S3 server, the requests
counted by the proxy of tests/helpers/s3.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.conftest import lora_state, lora_step
from tests.helpers.s3 import FaultyProxy, S3Server

import statekeeper as sk


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.new_bucket()


@pytest.fixture
def proxy(s3_server: S3Server) -> FaultyProxy:
    return FaultyProxy(s3_server.port)


def through(proxy: FaultyProxy, bucket: str) -> sk.storage.FsspecStorage:
    storage = sk.storage.FsspecStorage(f"s3://{bucket}/run", **proxy.options)
    storage.fs.retries = 1
    return storage


def listings(requests: list[str]) -> list[str]:
    return [r for r in requests if "list-type=2" in r]


def test_the_newest_step_of_a_mirror_costs_listings_that_do_not_grow_with_its_files(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    remote = sk.storage.FsspecStorage(f"s3://{bucket}/run", **s3_server.options)
    state, adapter, opt = lora_state(width=64)
    with sk.Checkpointer(tmp_path / "node-a", mirror=sk.Mirror(remote)) as ckpt:
        for step in (1, 2, 3):
            lora_step(adapter, opt)
            ckpt.save(step, state)
    saved = {k: v.clone() for k, v in state["model"].state_dict().items()}
    fs = s3_server.filesystem()
    fs.pipe({f"{bucket}/run/other-{i:03d}/notes.txt": b"not a step" for i in range(50)})

    def resume(node: str) -> list[str]:
        proxy.requests.clear()
        fresh, _, _ = lora_state(width=64)
        with sk.Checkpointer(tmp_path / node, mirror=sk.Mirror(through(proxy, bucket))) as c:
            assert c.restore_latest(fresh) == 3  # an empty local tier: from the mirror
        for key, value in fresh["model"].state_dict().items():
            assert torch.equal(value, saved[key]), key
        return list(proxy.requests)

    few = resume("node-b")
    # every step holds 400 more objects (no manifest names them): 1,200 keys more in the run
    run = f"{bucket}/run"
    extra = {f"{run}/step_{s:09d}/extra-{i:04d}": b"x" for s in (1, 2, 3) for i in range(400)}
    fs.pipe(extra)
    many = resume("node-c")
    assert len(listings(many)) == len(listings(few)), (listings(few), listings(many))
    assert not any(f"step_00000000{s}" in r for r in many for s in (1, 2))  # never asked about
    assert not any("other-" in r for r in many)


def test_the_top_level_listing_is_never_served_from_a_cache(
    tmp_path: Path, s3_server: S3Server, proxy: FaultyProxy, bucket: str
) -> None:
    remote = sk.storage.FsspecStorage(f"s3://{bucket}/run", **s3_server.options)
    with sk.Checkpointer(tmp_path / "node-a", mirror=sk.Mirror(remote)) as ckpt:
        ckpt.save(1, {"w": torch.ones(100)})
    mirror = sk.Mirror(through(proxy, bucket))
    with sk.Checkpointer(tmp_path / "node-b", mirror=mirror) as reader:
        live = {"w": torch.zeros(100)}
        assert reader.restore_latest(live) == 1  # its client has listed the mirror once
        other = sk.storage.FsspecStorage(f"s3://{bucket}/run", **s3_server.options)
        with sk.Checkpointer(tmp_path / "node-c", mirror=sk.Mirror(other)) as writer:
            writer.save(2, {"w": torch.full((100,), 2.0)})  # another node, meanwhile
        assert reader.restore_latest(live) == 2
        assert torch.equal(live["w"], torch.full((100,), 2.0))
