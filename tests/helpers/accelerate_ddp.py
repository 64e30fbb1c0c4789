"""``tests.helpers.accelerate_run`` as a 2-process job (CPU, gloo), as ``accelerate launch``
would start it: the same arguments; rank 1 writes its results to OUT_FILE.rank1. Exits 0
when both ranks end, 9 when a rank was killed (the other is then stopped)."""

from __future__ import annotations

import os
import socket
import sys

import torch.multiprocessing as mp


def _rank(rank: int, port: int, argv: list[str]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
    )  # fmt: skip
    sys.argv = ["accelerate_run", *argv]
    from tests.helpers import accelerate_run

    accelerate_run.main()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.start_processes(_rank, args=(port, sys.argv[1:]), nprocs=2, start_method="fork")
    except mp.ProcessExitedException:
        sys.exit(9)


if __name__ == "__main__":
    main()
