"""A small training run that a scheduler pre-empts: one process, or one gloo rank of a job.

Run as ``python -m tests.helpers.preempt_ranks MODE RUN_DIR STEPS [RANK WORLD PORT]``:

- ``full``: train ``STEPS`` steps, print ``final <hash>``;
- ``preempt``: train with ``every=EverySteps(1000) | OnSignal(SIGTERM, SIGUSR1)``, printing
  ``step <i>`` after each boundary; on pre-emption print ``preempted <step>`` and exit with
  ``Checkpointer.PREEMPTED_EXIT_CODE`` (it waits on stdin after step ``PAUSE_AT``);
- ``resume``: restore the newest step, train up to ``STEPS``, print ``final <hash>``.

Each step draws from every generator the RNG state holds (torch, Python, numpy), so a resume
that missed one would end differently.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import statekeeper as sk

PAUSE_AT = 3
"""In ``preempt`` mode the run waits after this step's boundary for a line on stdin: the test
sends the signal meanwhile, so the first boundary after it is ``PAUSE_AT + 1``."""


def _build(rank: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(100 + rank)
    random.seed(100 + rank)
    np.random.seed(100 + rank)
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, world: int) -> None:
    x = torch.randn(4, 6) * random.random() + float(np.random.rand())
    model(x).square().mean().backward()
    if world > 1:
        for p in model.parameters():  # a replicated model: average the gradients (DDP-like)
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
    opt.step()
    opt.zero_grad()


def _hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for t in model.state_dict().values():
        digest.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def run(mode: str, run_dir: Path, steps: int, rank: int, world: int) -> int:
    model, opt = _build(rank)
    every = sk.EverySteps(1000) | sk.OnSignal(signal.SIGTERM, signal.SIGUSR1)
    with sk.Checkpointer(run_dir, every=every) as ckpt:
        state = {"model": model, "opt": opt}
        start = 1
        if mode == "resume":
            resumed = ckpt.restore_latest(state)
            assert resumed is not None
            start = resumed + 1
        for i in range(start, steps):
            _step(model, opt, world)
            if mode == "preempt":
                ckpt.maybe_save(i, state)
                if ckpt.preempted:
                    print(f"preempted {i}", flush=True)
                    return ckpt.PREEMPTED_EXIT_CODE
                print(f"step {i}", flush=True)
                if i == PAUSE_AT:
                    sys.stdin.readline()  # the test signals now, then lets the run go on
    print(f"final {_hash(model)}", flush=True)
    return 0


def main() -> None:
    mode, run_dir, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    rank, world = 0, 1
    if len(sys.argv) > 4:
        rank, world, port = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    code = run(mode, run_dir, steps, rank, world)
    if world > 1:
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # gloo's teardown with the interpreter can abort a finished rank
    sys.exit(code)


if __name__ == "__main__":
    main()
