"""A tiny Lightning training run whose checkpoints are statekeeper steps.

Usage: python -m tests.helpers.lightning_run CKPT_DIR OUT_FILE EVERY KILL_AFTER [resume|-]
[async|-]
[VERSION_FILE].
Trains 20 steps (8 batches an epoch) of a small model with dropout, Adam and a StepLR
schedule on a shuffled StatefulDataLoader (with the Lightning package
``tests.helpers.lightning_pkg`` names), with ``StatekeeperCheckpointIO`` and
``StatekeeperCallback``, a ``ModelCheckpoint`` every EVERY steps (``save_last=True``).
After step KILL_AFTER (0: never) it SIGKILLs itself; with ``resume`` it resumes through
``trainer.fit(..., ckpt_path="last")``; with ``async`` the plugin is wrapped in Lightning's
``AsyncCheckpointIO`` (saves on its thread). At the end it writes every parameter and one more
random draw to OUT_FILE, and Lightning's version to VERSION_FILE.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch
from safetensors.torch import save_file
from tests.helpers.lightning_pkg import check_alone, trainer
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

pl = trainer()  # pytorch_lightning or lightning.pytorch ($STATEKEEPER_TEST_LIGHTNING)
Callback, ModelCheckpoint = pl.Callback, pl.callbacks.ModelCheckpoint
AsyncCheckpointIO = pl.plugins.io.AsyncCheckpointIO


# (typing) the Lightning package is picked at run time
class Tiny(pl.LightningModule):  # type: ignore[name-defined]
    def __init__(self) -> None:
        super().__init__()
        layers = (torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 4, 0.5)}


class KillAfter(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            # AsyncCheckpointIO: the saves asked for so far are written first, so that what
            # the kill leaves does not depend on how fast the thread was (a loaded machine)
            executor = getattr(trainer.strategy.checkpoint_io, "_executor", None)
            if executor is not None:
                executor.shutdown(wait=True)
            os.kill(os.getpid(), signal.SIGKILL)  # a hard kill, right after that step


def main() -> None:
    where, out, every, kill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = StatefulDataLoader(data, batch_size=4, shuffle=True)
    model = Tiny()
    saves = ModelCheckpoint(dirpath=where, every_n_train_steps=every, save_last=True, save_top_k=-1)
    callbacks: list[Callback] = [StatekeeperCallback(), saves]
    io: Any = StatekeeperCheckpointIO()
    if sys.argv[6:7] == ["async"]:
        io = AsyncCheckpointIO(io)
    if kill:
        callbacks.append(KillAfter(kill))
    trainer = pl.Trainer(
        max_steps=20, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks, plugins=[io],
    )  # fmt: skip
    trainer.fit(model, loader, ckpt_path="last" if sys.argv[5:6] == ["resume"] else None)
    final = {f"param/{k}": v.detach().clone() for k, v in model.state_dict().items()}
    final["draw"] = torch.rand(4)
    save_file(final, out)
    check_alone()
    if len(sys.argv) > 7:
        with open(sys.argv[7], "w") as f:
            f.write(pl.__version__)


if __name__ == "__main__":
    main()
