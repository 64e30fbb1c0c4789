"""A script whose mirror is a file system that hangs (as an NFS mount that stopped
answering does): every file written there blocks for ever, and no timeout can end it.

Usage: python -m tests.helpers.mirror_hang RUN_DIR close|exit. The mirror is the fsspec
back-end ``hang://`` (an in-memory file system whose writes never return). Saves steps 1
and 2 with ``Mirror(close_timeout=1)``, then calls ``close()`` (``close``) or returns from
main without it (``exit``): either way the process must end, saying which steps did not
reach the mirror.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, ClassVar

import fsspec
import torch
from fsspec.implementations.memory import MemoryFileSystem

import statekeeper as sk


class HangingFileSystem(MemoryFileSystem):
    """Reads and listings answer; a file opened for writing never does."""

    protocol = ("hang",)
    root_marker = "/"
    store: ClassVar[dict[str, Any]] = {}  # its own, not memory://'s
    pseudo_dirs: ClassVar[list[str]] = [""]

    def open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            threading.Event().wait()  # never set: the request hangs, uninterruptible
        return super().open(path, mode, *args, **kwargs)


def main() -> None:
    run, how = sys.argv[1], sys.argv[2]
    fsspec.register_implementation("hang", HangingFileSystem, clobber=True)
    mirror = sk.Mirror(sk.storage.FsspecStorage("hang://mirror/run"), close_timeout=1.0)
    ckpt = sk.Checkpointer(run, mirror=mirror)
    for step in (1, 2):
        ckpt.save(step, {"w": torch.full((1000,), float(step))})
    print("saved", flush=True)
    if how == "close":
        ckpt.close()
        print("closed", flush=True)


if __name__ == "__main__":
    main()
