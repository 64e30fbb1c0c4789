"""A helper module's ``main()`` run as a 2-process job (CPU, gloo), as ``torchrun`` or
``accelerate launch`` would start it: each rank gets the launcher's environment and the same
arguments. :func:`run` exits 0 when both ranks end, 9 when a rank was killed (the other is
then stopped). The ranks are forked, not spawned: they start with torch imported."""

from __future__ import annotations

import importlib
import os
import socket
import sys

import torch.multiprocessing as mp


def _rank(rank: int, port: int, module: str, argv: list[str]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
    )  # fmt: skip
    sys.argv = [module.rsplit(".", 1)[-1], *argv]
    importlib.import_module(module).main()


def run(module: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        # (typing) re-exported by torch without __all__
        mp.start_processes(_rank, args=(port, module, sys.argv[1:]), nprocs=2, start_method="fork")  # type: ignore[attr-defined]
    # (typing) re-exported by torch without __all__
    except mp.ProcessExitedException:  # type: ignore[attr-defined]
        sys.exit(9)
