"""Saves a deterministic state for step after step until it is killed.

Usage: python -m tests.helpers.saver RUN_DIR FIRST_STEP [async|sync] [keep|all] [SAVES]. Prints
each step it saves. With ``keep`` the Checkpointer keeps only the newest step (retention deletes
the rest). With ``SAVES`` it stops after that many saves and prints ``done`` (a child told to kill
itself at a point of a save, ``STATEKEEPER_TEST_KILL_AT``, then never runs forever).
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
    keep = sk.KeepLatest(1) if sys.argv[4:5] == ["keep"] else None
    last = first + int(sys.argv[5]) if len(sys.argv) > 5 else None
    print("ready", flush=True)
    step = first
    if asynchronous or keep is not None:  # async: the Checkpointer writes in a thread
        with sk.Checkpointer(
            directory, blocking=not asynchronous, shard_bytes=100_000, keep=keep
        ) as ckpt:
            while step != last:
                ckpt.save(step, state_for(step))
                print(step, flush=True)
                step += 1
    else:
        while step != last:
            sk.save(directory, state_for(step), step=step, shard_bytes=100_000)
            print(step, flush=True)
            step += 1
    print("done", flush=True)


if __name__ == "__main__":
    main()
