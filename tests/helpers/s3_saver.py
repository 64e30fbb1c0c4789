"""Saves to an S3 server, then stops half-way through uploading the next step.

Usage: python -m tests.helpers.s3_saver ENDPOINT URL. Commits step 1 to ``URL`` (an
``s3://`` run directory on the server at ``ENDPOINT``), then saves step 2 and, once its
first file is uploaded, prints ``mid-upload`` and waits for the SIGKILL that the test sends.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

import statekeeper as sk
from statekeeper.storage import fsspec as fsspec_storage


def main() -> None:
    endpoint, url = sys.argv[1], sys.argv[2]
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    storage = sk.FsspecStorage(url, **options)
    state = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(1000)}
    sk.save(storage, state, step=1, shard_bytes=500_000)
    real = fsspec_storage._FsspecFiles.write_chunks

    def then_wait(self: Any, name: str, chunks: Any) -> None:
        real(self, name, chunks)
        print("mid-upload", flush=True)
        while True:
            time.sleep(60)  # killed here, with step 2 half uploaded

    fsspec_storage._FsspecFiles.write_chunks = then_wait  # type: ignore[method-assign]
    state["w"] += 1
    sk.save(storage, state, step=2, shard_bytes=500_000)


if __name__ == "__main__":
    main()
