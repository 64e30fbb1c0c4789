"""Benchmark: checkpoint I/O of a CUDA state (about 4 GiB), on a machine with a GPU.

The same comparisons as bench/io.py (durable save, load into the live module warm and cold,
async caller stall and commit, peak extra host RSS per save), on the same size mix of
tensors living on the GPU. The differences (see bench/README.md):

- raw write bound: one device-to-host copy of every tensor into a preallocated pinned buffer
  (``copy_(non_blocking=True)`` + synchronize), then the same ``write``/``writev`` + fsyncs;
- raw read bound: ``readinto`` of statekeeper's files into a preallocated pinned buffer, then
  one host-to-device copy of those bytes into a preallocated device buffer;
- async: the stall is also compared with a pinned device-to-host copy of the state
  (``torch.empty(..., pin_memory=True)`` + ``copy_(non_blocking=True)`` + synchronize), next to
  the plain copy into pageable ``torch.empty`` buffers.

    .venv/bin/python bench/io_gpu.py [--runs 3] [--size-mib 4096] [--json OUT] [--skip-peak]

Exits with status 1 and a message when CUDA is not available.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.io import main

DEFAULT_SIZE_MIB = 4096


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print(
            f"bench/io_gpu.py needs a CUDA GPU, and torch {torch.__version__} sees none "
            "(torch.cuda.is_available() is False). Run bench/io.py for the CPU benchmark.",
            file=sys.stderr,
        )
        sys.exit(1)
    sys.exit(main(device="cuda", default_size=DEFAULT_SIZE_MIB))
