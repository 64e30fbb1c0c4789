"""A Checkpointer whose mirror upload of step 2 is cut by a SIGKILL.

Usage: python -m tests.helpers.mirror_saver RUN_DIR ENDPOINT URL. Saves step 1 (committed
locally and uploaded), then step 2; once the first file of step 2's upload is on the server
it prints ``mid-upload`` and waits for the test's SIGKILL.
"""

from __future__ import annotations

import sys

import torch
from tests.helpers.s3 import options_for, pause_after_first_upload

import statekeeper as sk


def main() -> None:
    run, endpoint, url = sys.argv[1], sys.argv[2], sys.argv[3]
    mirror = sk.Mirror(sk.FsspecStorage(url, **options_for(endpoint)))
    state = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(1000)}
    with sk.Checkpointer(run, mirror=mirror, shard_bytes=500_000) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        pause_after_first_upload()
        state["w"] += 1
        ckpt.save(2, state)
        ckpt.wait()


if __name__ == "__main__":
    main()
