"""An overwrite of a committed step on an object store (moto's S3 server through s3fs),
killed half-way: at every instant the step has a complete, committed copy that readers
find, and recovery puts it back under its own name."""

from __future__ import annotations

import subprocess
import sys

import torch
from tests.helpers import launcher
from tests.helpers.s3 import S3Server

import statekeeper as sk


def test_an_overwrite_killed_half_way_on_an_object_store_never_loses_the_step(
    s3_server: S3Server,
) -> None:
    url = f"s3://{s3_server.new_bucket()}/run"
    storage = sk.storage.FsspecStorage(url, **s3_server.options)
    sk.save(storage, {"w": torch.ones(1000)}, step=1)
    child = launcher.Popen(
        [sys.executable, "-m", "tests.helpers.store_overwrite", s3_server.endpoint, url],
        cwd=launcher.ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "mid-upload"  # the new version half written
        reader = sk.storage.FsspecStorage(url, **s3_server.options)  # another process's client
        live = {"w": torch.zeros(1000)}
        assert [i.step for i in sk.list_checkpoints(reader)] == [1]
        assert sk.load(reader, live).step == 1 and torch.equal(live["w"], torch.ones(1000))
    finally:
        child.kill()
        child.wait()
    live = {"w": torch.zeros(1000)}
    assert sk.load(storage, live, step=1).step == 1 and torch.equal(live["w"], torch.ones(1000))
    assert sk.audit.verify(storage).ok
    sk.audit.remove_partial(storage)  # recovery: the set-aside copy is step_000000001 again
    assert storage.top_level() == ["step_000000001"]
    live = {"w": torch.zeros(1000)}
    assert sk.load(storage, live).step == 1 and torch.equal(live["w"], torch.ones(1000))
    sk.save(storage, {"w": torch.full((1000,), 3.0)}, step=1, overwrite=True)  # completes
    assert storage.top_level() == ["step_000000001"]  # the copy set aside is gone
    assert sk.load(storage, live).step == 1 and torch.equal(live["w"], torch.full((1000,), 3.0))
