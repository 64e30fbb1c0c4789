"""A tiny Accelerate training run that checkpoints through statekeeper.

Usage: python -m tests.helpers.accelerate_run PROJECT_DIR OUT_FILE EVERY KILL_AFTER
[resume]. Trains 20 steps (8 batches an epoch, so across three epochs) of a small model
with dropout (draws from torch's RNG), Adam, a LR schedule and a shuffled stateful loader
(Accelerate's seedable sampler, no generator of its own), saving with
``statekeeper.integrations.accelerate.save_state`` every EVERY steps. After step KILL_AFTER
(0: never) it SIGKILLs itself. With ``resume`` it first loads the newest step with
``load_state``. At the end it writes every parameter, the optimizer's moments, the steps it
trained and one more random draw to OUT_FILE.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import ProjectConfiguration
from safetensors.torch import save_file
from torch.utils.data import TensorDataset

from statekeeper.integrations.accelerate import load_state, save_state

STEPS = 20


def main() -> None:
    project, out, every, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
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
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    step = load_state(accelerator).step if sys.argv[5:6] == ["resume"] else 0
    trained = []
    while step < STEPS:
        for x, y in loader:
            step += 1
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            trained.append(step)
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
    save_file({k: v.contiguous() for k, v in final.items()}, out)


if __name__ == "__main__":
    main()
