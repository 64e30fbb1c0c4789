"""A tiny Accelerate training run that checkpoints through statekeeper.

Usage: python -m tests.helpers.accelerate_run PROJECT_DIR OUT_FILE EVERY KILL_AFTER
[resume] [augment]. Trains 20 steps (8 batches an epoch, so across three epochs) of a small
model with dropout (draws from torch's RNG), Adam, a LR schedule and a shuffled stateful
loader (Accelerate's seedable sampler, no generator of its own), saving with
``statekeeper.integrations.accelerate.save_state`` every EVERY steps. After step KILL_AFTER
(0: never) it SIGKILLs itself. It resumes from the newest step when ``has_checkpoint``
says there is one (with ``resume``, there must be). With ``augment`` the loader has two
workers over a dataset that augments at random with Python's, numpy's and torch's RNGs in
``__getitem__`` (``persistent``: workers that persist across epochs). At the end it
writes every parameter, the optimizer's moments, the steps it trained, the inputs of every
step and one more random draw to OUT_FILE.

As a DDP job (tests.helpers.accelerate_ddp) rank 1 writes to OUT_FILE.rank1; each rank is
seeded apart once the model is built (DDP broadcasts rank 0's weights) and seeds its
workers apart, so that the ranks' dropout and augmentation differ.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import sys

import numpy as np
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import ProjectConfiguration
from safetensors.torch import save_file
from torch.utils.data import Dataset, TensorDataset

from statekeeper.integrations.accelerate import has_checkpoint, load_state, save_state

STEPS = 20


class Augmenting(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Noise from all three RNGs of the process that draws the item (a loader worker)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = random.random() + float(np.random.rand()) + torch.rand(8)
        return self.x[i] + noise, self.y[i]


def seed_worker(worker_id: int, rank: int) -> None:
    """Each rank's workers seeded apart (as the transformers Trainer's ``seed_worker``)."""
    seed = (torch.initial_seed() + 7919 * rank) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def main() -> None:
    project, out, every, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    augment = "augment" in sys.argv[5:]
    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=project, automatic_checkpoint_naming=True, total_limit=2
        ),
        dataloader_config=DataLoaderConfiguration(
            use_stateful_dataloader=True, use_seedable_sampler=True
        ),
    )
    torch.manual_seed(0)
    layers = (torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    data = Augmenting() if augment else TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    workers = 2 if augment else 0
    init = functools.partial(seed_worker, rank=accelerator.process_index)
    loader = torch.utils.data.DataLoader(
        data, batch_size=4, shuffle=True, num_workers=workers, worker_init_fn=init,
        persistent_workers="persistent" in sys.argv[5:],
    )  # fmt: skip
    torch.manual_seed(100 + accelerator.process_index)  # each rank its own random stream
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    resuming = has_checkpoint(accelerator)
    assert resuming == ("resume" in sys.argv[5:]), resuming
    step = load_state(accelerator).step if resuming else 0
    trained, inputs = [], []
    while step < STEPS:
        for x, y in loader:
            step += 1
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            trained.append(step)
            inputs.append(x)
            if step % every == 0 and step < STEPS:
                save_state(accelerator, step=step)
            if step == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)  # a hard kill, right after that step
            if step == STEPS:
                break
    final = {f"param/{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, s in enumerate(opt.optimizer.state.values()):
        final |= {f"adam/{i}/{k}": v.clone() for k, v in s.items() if torch.is_tensor(v)}
    final["draw"] = torch.rand(4)
    final["trained"] = torch.tensor(trained)
    final |= {f"input/{s}": x for s, x in zip(trained, inputs, strict=True)}
    rank = accelerator.process_index
    save_file({k: v.contiguous() for k, v in final.items()}, f"{out}.rank{rank}" if rank else out)


if __name__ == "__main__":
    main()
