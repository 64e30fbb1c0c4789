"""statekeeper with the Lightning Trainer: a run SIGKILLed mid-epoch resumes bitwise.

The model trains for 3 epochs on a shuffling ``StatefulDataLoader`` with two worker
processes whose dataset augments at random (wrapped in ``statekeeper.data.WorkerRNGDataset``).
Three processes run it: one uninterrupted; one saving every 4 steps and SIGKILLed after
step 9 (mid-epoch 1); one that resumes with ``ckpt_path="last"`` and finishes. The final
weights of the first and the third are compared bit for bit, and the resumed model is
loaded again for inference with ``statekeeper.integrations.lightning.load_from_checkpoint``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

import statekeeper as sk
from statekeeper.integrations.lightning import (
    StatekeeperCallback,
    StatekeeperCheckpointIO,
    load_from_checkpoint,
)


class Jittered(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(48, 8, generator=generator), torch.randn(48, 1)

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn(8), self.y[i]  # random augmentation


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, hidden), torch.nn.Dropout(0.2), torch.nn.Linear(hidden, 1)
        )

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.01)


class KillAfter(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def train(where: str, kill: int, out: str) -> None:
    pl.seed_everything(0, verbose=False)
    loader = StatefulDataLoader(
        sk.data.WorkerRNGDataset(Jittered()), batch_size=8, shuffle=True, num_workers=2
    )
    callbacks: list[Callback] = [
        StatekeeperCallback(),
        ModelCheckpoint(dirpath=where, every_n_train_steps=4, save_last=True),
    ]
    if kill:
        callbacks.append(KillAfter(kill))
    trainer = pl.Trainer(
        max_epochs=3, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks, plugins=[StatekeeperCheckpointIO()],
    )  # fmt: skip
    model = Regressor()
    trainer.fit(model, loader, ckpt_path="last")  # a fresh start when there is none yet
    torch.save(model.state_dict(), out)


def main() -> None:
    if sys.argv[1:2] == ["train"]:
        train(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    work = Path(tempfile.mkdtemp(prefix="sk-lightning-"))
    try:

        def run(name: str, kill: int) -> int:
            args = [sys.executable, __file__, "train", str(work / name), str(kill)]
            done = subprocess.run([*args, str(work / f"{name}.pt")], capture_output=True)
            return done.returncode

        assert run("straight", 0) == 0
        assert run("killed", 9) == -signal.SIGKILL
        newest = sk.list_checkpoints(work / "killed" / "last.ckpt")[-1].step
        print(f"killed after step 9; newest step: {newest}")
        assert run("killed", 0) == 0  # the same directory: resumes from last.ckpt
        a = torch.load(work / "straight.pt", weights_only=True)
        b = torch.load(work / "killed.pt", weights_only=True)
        same = all(torch.equal(a[k], b[k]) for k in a)
        print("resumed run's weights are " + ("bitwise identical" if same else "DIFFERENT"))
        model = load_from_checkpoint(Regressor, work / "killed" / "last.ckpt", map_location="cpu")
        print(f"loaded for inference: hidden={model.hparams['hidden']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
