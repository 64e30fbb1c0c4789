"""A tiny run of torchtitan's own components checkpointing through statekeeper's manager.

Usage: python -m tests.helpers.torchtitan_run DUMP_FOLDER OUT_FILE EVERY KILL [ASYNC].
The loop makes the manager calls torchtitan's ``Trainer.train`` makes, in its order:
``load(step=load_step)`` first, then after each step ``save(step, last_step=...)``, and
``close()`` at the end. The parts are torchtitan's: ``OptimizersContainer`` (AdamW),
``LRSchedulersContainer`` (warm-up), ``ParallelAwareDataloader`` (shuffled); the model has
dropout. 20 steps of 8 batches an epoch; after step KILL (0: never) the run SIGKILLs
itself. ASYNC (``async``) saves in the background. At the end it writes every parameter,
the optimizer's flattened state, the loss of each step run and one more random draw.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch
from safetensors.torch import save_file
from torch.utils.data import TensorDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig

from statekeeper.integrations.torchtitan import StatekeeperCheckpointManager

STEPS = 20


class TrainState:
    """The trainer's own entry (torchtitan saves the Trainer itself as ``train_state``)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def build(
    dump: str, every: int, mode: str, sd_adapter: Any = None, **config: Any
) -> tuple[Any, ...]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
    )
    groups = [ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-2})]
    optimizers = OptimizersContainer.Config(param_groups=groups, implementation="for-loop").build(
        model_parts=[model]
    )
    schedulers = LRSchedulersContainer.Config(warmup_steps=3).build(
        optimizers=optimizers, training_steps=STEPS
    )
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))
    loader = ParallelAwareDataloader(data, dp_rank=0, dp_world_size=1, batch_size=4, shuffle=True)
    state = TrainState()
    options = {"enable": True, "interval": every, "keep_latest_k": 2, **config}
    if mode == "async":
        options["async_mode"] = "async"
    manager = StatekeeperCheckpointManager.Config(**options).build(
        dataloader=loader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={"train_state": state},
        sd_adapter=sd_adapter,
        base_folder=dump,
    )
    return model, optimizers, schedulers, loader, state, manager


def batches(loader: Any) -> Any:
    while True:
        yield from loader


def main() -> None:
    dump, out, every, kill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else ""
    model, optimizers, schedulers, loader, state, manager = build(dump, every, mode)
    manager.load(step=-1)
    losses = []
    data = batches(loader)
    while state.step < STEPS:
        state.step += 1
        x, y = next(data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        losses.append(loss.detach())
        manager.save(state.step, last_step=state.step == STEPS)
        if state.step == kill:
            os.kill(os.getpid(), signal.SIGKILL)
    manager.close()
    final = {f"param/{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for k, v in optimizers.state_dict().items():
        if torch.is_tensor(v):
            final[f"optim/{k}"] = v.clone()
    final["losses"] = torch.stack(losses)
    final["steps"] = torch.arange(STEPS - len(losses) + 1, STEPS + 1)
    final["draw"] = torch.rand(4)
    save_file({k: v.contiguous() for k, v in final.items()}, out)


if __name__ == "__main__":
    main()
