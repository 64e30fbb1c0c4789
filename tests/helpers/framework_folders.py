"""Folders of framework checkpoints written by the real frameworks, for the CLI tests.

Usage: python -m tests.helpers.framework_folders OUT_DIR. Writes, each from a 4-step run
of a tiny model saving at steps 2 and 4:

- ``lightning-sk``: a ``ModelCheckpoint`` directory through ``StatekeeperCheckpointIO``
  (each ``*.ckpt`` a directory holding a statekeeper step; ``last.ckpt`` too);
- ``lightning-stock``: the same with Lightning's own ``CheckpointIO`` (pickle files);
- ``hf-sk`` / ``hf-stock``: a ``Trainer`` output directory (``checkpoint-2``,
  ``checkpoint-4``) of ``StatekeeperTrainer`` / of the stock ``Trainer``;
- ``accelerate-sk`` / ``accelerate-stock``: an Accelerate project directory with
  ``automatic_checkpoint_naming``, saved through ``statekeeper.integrations.accelerate`` /
  by ``Accelerator.save_state`` (``checkpoints/checkpoint_0``, ``checkpoint_1``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

STEPS, EVERY = 4, 2


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))


def lightning(where: Path, statekeeper: bool) -> None:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import Callback, ModelCheckpoint

    from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    saves = ModelCheckpoint(dirpath=where, every_n_train_steps=EVERY, save_last=True, save_top_k=-1)
    # (typing) Lightning's classes from the package picked at run time
    callbacks: list[Callback] = [saves, *([StatekeeperCallback()] if statekeeper else [])]  # type: ignore[list-item]
    trainer = pl.Trainer(
        max_steps=STEPS, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks,
        # (typing) Lightning's classes from the package picked at run time
        plugins=[StatekeeperCheckpointIO()] if statekeeper else None,  # type: ignore[list-item]
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(_data(), batch_size=4)
    trainer.fit(Tiny(), loader)


class _Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}


def trainer(where: Path, statekeeper: bool) -> None:
    from transformers import Trainer, TrainingArguments

    from statekeeper.integrations.transformers import StatekeeperTrainer

    x, y = _data().tensors
    rows = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    args = TrainingArguments(
        output_dir=str(where), max_steps=STEPS, per_device_train_batch_size=4,
        save_strategy="steps", save_steps=EVERY, report_to=[], use_cpu=True, seed=0,
        disable_tqdm=True, remove_unused_columns=False,
    )  # fmt: skip
    torch.manual_seed(0)
    kind = StatekeeperTrainer if statekeeper else Trainer
    kind(model=_Regressor(), args=args, train_dataset=rows).train()


def accelerate(where: Path, statekeeper: bool) -> None:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from statekeeper.integrations.accelerate import save_state

    config = ProjectConfiguration(project_dir=str(where), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(_data(), batch_size=4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for step, (x, y) in enumerate(loader, start=1):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        if step % EVERY == 0:
            if statekeeper:
                save_state(accelerator)
            else:
                accelerator.save_state()


def main() -> None:
    out = Path(sys.argv[1])
    for name, make in (("lightning", lightning), ("hf", trainer), ("accelerate", accelerate)):
        for statekeeper in (True, False):
            make(out / f"{name}-{'sk' if statekeeper else 'stock'}", statekeeper)


if __name__ == "__main__":
    main()
