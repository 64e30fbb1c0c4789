"""Saves a deterministic state for step after step until it is killed.

Usage: python -m tests.helpers.saver RUN_DIR FIRST_STEP [async]. Prints each step it saves.
"""

from __future__ import annotations

import sys

import torch

import statekeeper as sk


def state_for(step: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(step)
    weight = torch.randn(256, 256, generator=gen)
    return {
        "model": {"weight": weight, "tied": weight, "bias": torch.randn(256, generator=gen)},
        "opt": {"state": {0: {"step": torch.tensor(float(step))}}, "lr": 0.1 / (step + 1)},
        "step": step,
        "buffers": [torch.randn(64, 64, generator=gen) for _ in range(8)],
    }


def main() -> None:
    directory, first = sys.argv[1], int(sys.argv[2])
    asynchronous = len(sys.argv) > 3 and sys.argv[3] == "async"
    print("ready", flush=True)
    step = first
    if asynchronous:  # the Checkpointer writes in a background thread
        with sk.Checkpointer(directory, async_save=True, shard_bytes=100_000) as ckpt:
            while True:
                ckpt.save(step, state_for(step))
                print(step, flush=True)
                step += 1
    while True:
        sk.save(directory, state_for(step), step=step, shard_bytes=100_000)
        print(step, flush=True)
        step += 1


if __name__ == "__main__":
    main()
