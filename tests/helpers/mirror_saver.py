"""A Checkpointer whose mirror upload of step 2 is cut by a SIGKILL.

Usage: python -m tests.helpers.mirror_saver RUN_DIR ENDPOINT URL. Saves step 1 (committed
locally and uploaded), then step 2; once the first file of step 2's upload is on the server
it prints ``mid-upload`` and waits for the test's SIGKILL.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

import statekeeper as sk
from statekeeper.storage import fsspec as fsspec_storage


def main() -> None:
    run, endpoint, url = sys.argv[1], sys.argv[2], sys.argv[3]
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    mirror = sk.Mirror(sk.FsspecStorage(url, **options))
    state = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(1000)}
    with sk.Checkpointer(run, mirror=mirror, shard_bytes=500_000) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        real = fsspec_storage._FsspecFiles.write_chunks

        def then_wait(self: Any, name: str, chunks: Any) -> None:
            real(self, name, chunks)
            print("mid-upload", flush=True)
            while True:
                time.sleep(60)  # killed here, with step 2 half uploaded

        fsspec_storage._FsspecFiles.write_chunks = then_wait  # type: ignore[method-assign]
        state["w"] += 1
        ckpt.save(2, state)
        ckpt.wait()


if __name__ == "__main__":
    main()
