"""A 2-process DDP Lightning run (CPU, gloo) whose checkpoints are statekeeper steps.

Usage: python -m tests.helpers.lightning_ddp CKPT_DIR. Lightning starts the second process
itself. Each rank prints ``done <rank>`` at the end.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from tests.helpers.lightning_pkg import check_alone, trainer
from torch.utils.data import DataLoader, TensorDataset

from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

pl = trainer()  # pytorch_lightning or lightning.pytorch ($STATEKEEPER_TEST_LIGHTNING)
ModelCheckpoint = pl.callbacks.ModelCheckpoint


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters())


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    saves = ModelCheckpoint(dirpath=sys.argv[1], every_n_train_steps=2, save_last=True)
    trainer = pl.Trainer(
        max_steps=4, accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[StatekeeperCallback(), saves], plugins=[StatekeeperCheckpointIO()],
    )  # fmt: skip
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    check_alone()
    print(f"done {trainer.global_rank}", flush=True)


if __name__ == "__main__":
    main()
