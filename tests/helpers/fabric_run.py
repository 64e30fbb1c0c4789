"""A tiny Lightning Fabric run whose checkpoints are statekeeper steps.

Usage: python -m tests.helpers.fabric_run CKPT_DIR OUT_FILE EVERY KILL [resume] [reversed].
Trains 20 steps (8 batches an epoch) of a small model with dropout, Adam and a StepLR
schedule on a shuffled ``StatefulDataLoader``, saving ``fabric.save(CKPT_DIR/last, state)``
every EVERY steps through ``StatekeeperCheckpointIO``. The state holds the model, the
optimizer by parameter name, the scheduler, the loader's position, the step and every RNG.
After step KILL (0: never) it SIGKILLs itself; with ``resume`` it first calls
``fabric.load``. With ``reversed`` the model registers its parameters in the reverse order
(the same names). At the end it writes every parameter and one more random draw.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from safetensors.torch import save_file
from tests.helpers.lightning_pkg import check_alone, fabric
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import statekeeper as sk
from statekeeper.integrations.lightning import LoaderState, NamedOptimizer, StatekeeperCheckpointIO

Fabric = fabric().Fabric  # lightning_fabric or lightning.fabric ($STATEKEEPER_TEST_LIGHTNING)

STEPS = 20


class Net(torch.nn.Module):
    def __init__(self, backwards: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        first, second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
        if backwards:  # the same names and values, registered in the other order
            self.second, self.first = second, first
        else:
            self.first, self.second = first, second
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.second(self.drop(self.first(x)))
        return out


def main() -> None:
    where, out, every, kill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[StatekeeperCheckpointIO()])
    model = Net("reversed" in sys.argv[5:])
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 4, 0.5)
    model, opt = fabric.setup(model, opt)
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = StatefulDataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator())
    state = {
        "model": model,
        "optimizer": NamedOptimizer(opt, model),
        "scheduler": sched,
        "loader": LoaderState(loader),
        "step": 0,
        "rng": sk.RNGState(),  # last: Fabric loads in this order
    }
    if "resume" in sys.argv[5:]:
        fabric.load(os.path.join(where, "last"), state)
    step = state["step"]
    while step < STEPS:
        for x, y in loader:
            step += 1
            fabric.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
            if step % every == 0:
                state["step"] = step
                fabric.save(os.path.join(where, "last"), state)
            if step == kill:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == STEPS:
                break
    final = {f"param/{k}": v.detach().clone() for k, v in model.state_dict().items()}
    final["draw"] = torch.rand(4)
    save_file(final, out)
    check_alone()


if __name__ == "__main__":
    main()
