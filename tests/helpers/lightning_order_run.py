"""A 2-process DDP Lightning run (CPU, gloo) that records which samples each step trained on.

Usage: python -m tests.helpers.lightning_order_run CKPT_DIR LOG KILL [resume]. Lightning
starts the second process itself; each rank appends ``[global_step, [sample ids]]`` lines
to ``LOG.<rank>``. 32 samples, 4 per batch and rank: 4 steps an epoch, 10 steps. Lightning
gives the ``StatefulDataLoader`` (two worker processes) its ``DistributedSampler``
(shuffled by epoch). Each step also records one draw of torch's RNG. A
statekeeper step is saved after every step; after step KILL (0: never) every rank
SIGKILLs itself (before that step's save: the newest step is KILL - 1); with ``resume``
the run resumes with ``ckpt_path="last"``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from tests.helpers.lightning_fsdp_run import KillAfter
from tests.helpers.lightning_pkg import check_alone, trainer
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

pl = trainer()  # pytorch_lightning or lightning.pytorch ($STATEKEEPER_TEST_LIGHTNING)
Callback, ModelCheckpoint = pl.Callback, pl.callbacks.ModelCheckpoint


class Ids(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


# (typing) the Lightning package is picked at run time
class Recorder(pl.LightningModule):  # type: ignore[name-defined]
    def __init__(self, log: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.log_to = log

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        with open(f"{self.log_to}.{self.global_rank}", "a") as f:
            ids = batch.flatten().int().tolist()
            f.write(json.dumps([self.global_step, ids, torch.rand(()).item()]) + "\n")
        return self.lin(batch).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    where, log, kill = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pl.seed_everything(0, verbose=False)
    saves = ModelCheckpoint(dirpath=where, every_n_train_steps=1, save_last=True)
    callbacks: list[Callback] = [StatekeeperCallback(), saves]
    if kill:
        callbacks.append(KillAfter(kill))
    trainer = pl.Trainer(
        max_steps=10, accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        plugins=[StatekeeperCheckpointIO()],
    )  # fmt: skip
    loader = StatefulDataLoader(Ids(), batch_size=4, num_workers=2)
    trainer.fit(Recorder(log), loader, ckpt_path="last" if sys.argv[4:5] == ["resume"] else None)
    check_alone()


if __name__ == "__main__":
    main()
