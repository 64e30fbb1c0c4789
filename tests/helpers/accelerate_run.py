"""A tiny Accelerate training run that checkpoints through statekeeper every 3 steps.

Usage: python -m tests.helpers.accelerate_run PROJECT_DIR OUT_FILE [resume]. Trains 12 steps
of a small model with dropout (draws from torch's RNG), Adam, a LR schedule and a shuffled
stateful data loader (Accelerate's seedable sampler), saving with
``statekeeper.integrations.accelerate.save_state`` after steps 3, 6, 9; prints ``step N``
after each step. With ``resume`` it first loads the newest step with ``load_state``. At the
end it writes every parameter, the optimizer's moments and one more random draw to OUT_FILE.
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import ProjectConfiguration
from safetensors.torch import save_file
from torch.utils.data import TensorDataset

from statekeeper.integrations.accelerate import load_state, save_state

STEPS = 12


def main() -> None:
    project, out = sys.argv[1], sys.argv[2]
    resume = sys.argv[3:4] == ["resume"]
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
    data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
    shuffle = torch.Generator().manual_seed(7)  # a generator of its own: an order that resumes
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=shuffle)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    done = 0
    if resume:
        done = load_state(accelerator).step
    batches = iter(loader)
    for step in range(done + 1, STEPS + 1):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 3 == 0 and step < STEPS:
            save_state(accelerator, step=step)
        print(f"step {step}", flush=True)
    final = {f"param/{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, s in enumerate(opt.optimizer.state.values()):
        final |= {f"adam/{i}/{k}": v.clone() for k, v in s.items() if torch.is_tensor(v)}
    final["draw"] = torch.rand(4)
    save_file({k: v.contiguous() for k, v in final.items()}, out)


if __name__ == "__main__":
    main()
