"""A Lightning run bounded by ``max_epochs`` that records every step's samples and draws.

Usage: python -m tests.helpers.lightning_exact_run CKPT_DIR LOG SAVES KILL DEVICES [resume]
[stock].
3 epochs of 6 batches a rank (4 samples a batch) of a tiny model, on a shuffling
``StatefulDataLoader`` with two worker processes over a dataset that augments at random
(torch, numpy and Python's RNGs in ``__getitem__``; the dataset is the user's plain one,
not wrapped). SAVES is 0 (``ModelCheckpoint``'s default: a save as each epoch ends) or a
number N (``every_n_train_steps=N``); ``save_last=True``. DEVICES is 1 (one
process) or 2 (DDP over gloo, with torchdata's ``StatefulDistributedSampler`` and
``use_distributed_sampler=False``, each rank seeded apart). Each rank appends
``[global_step, [sample ids], [augmentations], draw]`` lines to ``LOG.<rank>`` (a draw of
torch's RNG in the training process); at the end it writes its parameters as
``[global_step, "final", [values]]``. After step KILL (0: never) every rank SIGKILLs itself;
with ``resume`` the run resumes with ``ckpt_path="last"``. With ``stock`` the run uses
neither the callback nor the plugin (plain Lightning, for comparison); with ``wrapped`` the
dataset is wrapped in ``statekeeper.data.WorkerRNGDataset`` (the fix the callback's warning names).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from typing import Any

import numpy as np
import torch
from tests.helpers.lightning_pkg import check_alone, trainer
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

import statekeeper as sk
from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

pl = trainer()  # pytorch_lightning or lightning.pytorch ($STATEKEEPER_TEST_LIGHTNING)
Callback, ModelCheckpoint = pl.Callback, pl.callbacks.ModelCheckpoint

BATCHES, BATCH, EPOCHS = 6, 4, 3


class Augmented(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = [torch.rand(()).item(), float(np.random.rand()), random.random()]
        return torch.tensor([float(i)]), torch.tensor(noise)


# (typing) the Lightning package is picked at run time
class Recorder(pl.LightningModule):  # type: ignore[name-defined]
    def __init__(self, log: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.log_to = log

    def _write(self, *row: Any) -> None:
        with open(f"{self.log_to}.{self.global_rank}", "a") as f:
            f.write(json.dumps([self.global_step, *row]) + "\n")

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        ids, noise = batch
        draw = torch.rand(()).item()
        self._write(ids.flatten().int().tolist(), noise.flatten().tolist(), draw)
        x = torch.cat([ids / 24, noise], dim=1)
        return (self.lin(x) * (1 + draw)).pow(2).mean()

    def on_fit_start(self) -> None:
        if self.trainer.world_size > 1:  # each rank draws its own stream (workers' seeds too)
            torch.manual_seed(10 + self.global_rank)

    def on_train_end(self) -> None:
        self._write("final", [p.flatten().tolist() for p in self.parameters()])

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.01)


class KillAfter(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)  # every rank, right after that step's save


def main() -> None:
    where, log, saves, kill, devices = sys.argv[1:6]
    more = sys.argv[6:]
    stock = "stock" in more
    pl.seed_everything(0, verbose=False)
    every = {} if saves == "0" else {"every_n_train_steps": int(saves)}
    checkpoints = ModelCheckpoint(dirpath=where, save_last=True, save_top_k=-1, **every)
    callbacks: list[Callback] = [checkpoints] if stock else [StatekeeperCallback(), checkpoints]
    if int(kill):
        callbacks.append(KillAfter(int(kill)))
    ranks = int(devices)
    data: Dataset[Any] = Augmented(BATCHES * BATCH * ranks)
    if "wrapped" in more:
        data = sk.data.WorkerRNGDataset(data)
    options: dict[str, Any] = {}
    if ranks > 1:
        options = {"strategy": "ddp", "use_distributed_sampler": False}
    trainer = pl.Trainer(
        max_epochs=EPOCHS, accelerator="cpu", devices=ranks, logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        plugins=[] if stock else [StatekeeperCheckpointIO()], **options,
    )  # fmt: skip
    if ranks > 1:
        rank = trainer.global_rank
        sampler = StatefulDistributedSampler(data, ranks, rank, shuffle=True, seed=0)
        loader = StatefulDataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=2)
    else:
        loader = StatefulDataLoader(data, batch_size=BATCH, shuffle=True, num_workers=2)
    trainer.fit(Recorder(log), loader, ckpt_path="last" if "resume" in more else None)
    check_alone()


if __name__ == "__main__":
    main()
