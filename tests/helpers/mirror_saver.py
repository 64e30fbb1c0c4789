"""A Checkpointer whose mirror upload of its last step is cut by a SIGKILL.

Usage: python -m tests.helpers.mirror_saver RUN_DIR ENDPOINT URL [LAST]. Saves steps 1 to
LAST - 1 (LAST: 2 by default), each committed locally and uploaded, then step LAST; once
the first file of that step's upload is on the server it prints ``mid-upload`` and waits
for the test's SIGKILL. With LAST given, the local tier keeps ``KeepLatest(1)`` and the
mirror ``KeepEvery(5)``.
"""

from __future__ import annotations

import sys

import torch
from tests.helpers.s3 import options_for, pause_after_first_upload

import statekeeper as sk


def main() -> None:
    run, endpoint, url = sys.argv[1], sys.argv[2], sys.argv[3]
    last = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    policies = len(sys.argv) > 4
    mirror = sk.Mirror(
        sk.storage.FsspecStorage(url, **options_for(endpoint)),
        keep=sk.KeepEvery(5) if policies else None,
    )
    keep = sk.KeepLatest(1) if policies else None
    state = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(1000)}
    with sk.Checkpointer(run, keep=keep, mirror=mirror, shard_bytes=500_000) as ckpt:
        for step in range(1, last):
            ckpt.save(step, state)
            ckpt.wait()
            state["w"] += 1
        pause_after_first_upload()
        ckpt.save(last, state)
        ckpt.wait()


if __name__ == "__main__":
    main()
