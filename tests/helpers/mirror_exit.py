"""A script that saves with a mirror and ends without ``close()`` (nor ``wait()``).

Usage: python -m tests.helpers.mirror_exit RUN_DIR ENDPOINT URL. Saves steps 1 to 3 and
returns from main at once, with their uploads queued: the interpreter's exit must finish
them or say which did not reach the mirror.
"""

from __future__ import annotations

import sys

import torch
from tests.helpers.s3 import options_for

import statekeeper as sk


def main() -> None:
    run, endpoint, url = sys.argv[1], sys.argv[2], sys.argv[3]
    mirror = sk.Mirror(sk.storage.FsspecStorage(url, **options_for(endpoint)))
    ckpt = sk.Checkpointer(run, mirror=mirror)
    state = {"w": torch.arange(300_000, dtype=torch.float32)}
    for step in (1, 2, 3):
        state["w"] += 1
        ckpt.save(step, state)
    print("saved", flush=True)


if __name__ == "__main__":
    main()
