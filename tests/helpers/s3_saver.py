"""Saves to an S3 server, then stops half-way through uploading the next step.

Usage: python -m tests.helpers.s3_saver ENDPOINT URL. Commits step 1 to ``URL`` (an
``s3://`` run directory on the server at ``ENDPOINT``), then saves step 2 and, once its
first file is uploaded, prints ``mid-upload`` and waits for the SIGKILL that the test sends.
"""

from __future__ import annotations

import sys

import torch
from tests.helpers.s3 import options_for, pause_after_first_upload

import statekeeper as sk


def main() -> None:
    endpoint, url = sys.argv[1], sys.argv[2]
    storage = sk.storage.FsspecStorage(url, **options_for(endpoint))
    state = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(1000)}
    sk.save(storage, state, step=1, shard_bytes=500_000)
    pause_after_first_upload()
    state["w"] += 1
    sk.save(storage, state, step=2, shard_bytes=500_000)


if __name__ == "__main__":
    main()
