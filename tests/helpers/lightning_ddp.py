"""A 2-process DDP Lightning run (CPU, gloo) whose checkpoints are statekeeper steps.

Usage: python -m tests.helpers.lightning_ddp CKPT_DIR [DEVICES [STEPS [resume]]] (2 devices,
4 steps by default). Lightning starts the other processes itself. Each rank prints
``warned <category>: <message>`` for each statekeeper warning of the fit, then ``done
<rank>``; with ``resume`` the fit resumes from CKPT_DIR/last.ckpt.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
from tests.helpers.lightning_pkg import check_alone, trainer
from torch.utils.data import DataLoader, TensorDataset

from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

pl = trainer()  # pytorch_lightning or lightning.pytorch ($STATEKEEPER_TEST_LIGHTNING)
ModelCheckpoint = pl.callbacks.ModelCheckpoint


# (typing) the Lightning package is picked at run time
class Tiny(pl.LightningModule):  # type: ignore[name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters())


def main() -> None:
    where = sys.argv[1]
    devices, steps = int((sys.argv[2:3] or ["2"])[0]), int((sys.argv[3:4] or ["4"])[0])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    saves = ModelCheckpoint(dirpath=where, every_n_train_steps=2, save_last=True)
    trainer = pl.Trainer(
        max_steps=steps, accelerator="cpu", devices=devices,
        strategy="ddp" if devices > 1 else "auto", logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[StatekeeperCallback(), saves], plugins=[StatekeeperCheckpointIO()],
    )  # fmt: skip
    resume = f"{where}/last.ckpt" if sys.argv[4:5] == ["resume"] else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Tiny(), DataLoader(data, batch_size=4), ckpt_path=resume)
    for w in caught:
        if str(w.message).startswith("statekeeper:"):
            print(f"warned {w.category.__name__}: {w.message}", flush=True)
    check_alone()
    print(f"done {trainer.global_rank}", flush=True)


if __name__ == "__main__":
    main()
