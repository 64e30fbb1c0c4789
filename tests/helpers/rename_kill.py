"""Overwrites a committed step and SIGKILLs itself right after the N-th rename of that save.

Usage: python -m tests.helpers.rename_kill RUN_DIR STEP N exchange|fallback [checkpointer]

The run directory holds STEP already (saved by the test with ``state_for(STEP)``). This
process saves ``state_for(STEP + 1000)`` as STEP with ``overwrite=True`` (through a
``Checkpointer`` with ``checkpointer``), counting every rename the save makes in the run
directory (``os.rename`` and the atomic exchange, ``renameat2(RENAME_EXCHANGE)``), and sends
itself a real SIGKILL right after the N-th one returns. It prints ``done`` when the save
returned with fewer than N renames (N is past the last one).

``fallback`` stands for a file system without ``RENAME_EXCHANGE`` (NFS, some FUSE file
systems): the exchange reports itself unsupported, as ``renameat2`` does there with
``EINVAL``, so the save takes the two-rename protocol.
"""

from __future__ import annotations

import os
import signal
import sys

from tests.helpers.saver import state_for

import statekeeper as sk
from statekeeper.storage import commit


def main() -> None:
    directory, step, limit, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    through_checkpointer = sys.argv[5:6] == ["checkpointer"]
    count = 0

    def counted() -> None:
        nonlocal count
        count += 1
        if count == limit:
            os.kill(os.getpid(), signal.SIGKILL)

    real_rename, real_exchange = os.rename, commit.exchange

    def rename(src: object, dst: object, *args: object, **kwargs: object) -> None:
        real_rename(src, dst, *args, **kwargs)
        counted()

    def exchange(a: object, b: object) -> bool:
        if mode == "fallback":
            return False
        swapped = real_exchange(a, b)
        assert swapped, "this file system has no RENAME_EXCHANGE: run the fallback mode"
        counted()
        return swapped

    os.rename = rename
    commit.exchange = exchange
    state = state_for(step + 1000)
    if through_checkpointer:
        with sk.Checkpointer(directory, shard_bytes=100_000) as ckpt:
            ckpt.save(step, state, overwrite=True)
    else:
        sk.save(directory, state, step=step, overwrite=True, shard_bytes=100_000)
    print("done", count, flush=True)


if __name__ == "__main__":
    main()
