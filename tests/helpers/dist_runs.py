"""A 2-rank FSDP2 training run for ``assert_resumes_exactly(..., world_size=2)``.

Built inside each rank after ``torch.distributed`` is initialized (the helper does that).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tests.helpers.dist_workers import fsdp_model, make_loader

from statekeeper.testing import Run


def fsdp_run() -> Run:
    world, rank = dist.get_world_size(), dist.get_rank()
    model = fsdp_model(world, seed=0)
    torch.manual_seed(500 + rank)  # each rank draws its own noise
    random.seed(500 + rank)  # every generator the run's RNG state holds starts seeded
    np.random.seed(500 + rank)
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    loader = make_loader(world, rank)
    batches: list[Any] = []

    def step(i: int) -> None:
        if not batches:
            batches.append(iter(loader))  # after a restore: the resumed iterator
        ids = next(batches[0]).float()
        x = torch.randn(4, 8) + ids.mean()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    return Run(state={"model": model, "optim": opt, "loader": loader}, step=step)


def fsdp_run_async() -> Run:
    """The same run, saving in the background (killed while a save may be in flight)."""
    run = fsdp_run()
    return Run(state=run.state, step=run.step, blocking=False)
