"""A 2-process Lightning run with FSDP2 (``ModelParallelStrategy``, CPU, gloo) whose
checkpoints are statekeeper steps through ``StatekeeperModelParallelStrategy``.

Usage: python -m tests.helpers.lightning_fsdp_run CKPT_DIR OUT_FILE EVERY KILL [resume].
Lightning starts the second process itself. 12 steps (4 batches an epoch per rank) of a
small model with dropout (each rank seeded apart), its linear layers sharded with
``fully_shard``, Adam, on samples that are all alike (see main); a ``ModelCheckpoint``
every EVERY steps (``save_last=True``). After step KILL (0: never) every rank SIGKILLs
itself; with ``resume`` the run resumes with ``ckpt_path="last"``. Rank 0 writes the full
parameters and one more random draw to OUT_FILE.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch
from safetensors.torch import save_file
from tests.helpers.lightning_pkg import check_alone, trainer
from torch.distributed.fsdp import fully_shard
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from statekeeper.integrations.lightning import StatekeeperCallback
from statekeeper.integrations.lightning_fsdp import StatekeeperModelParallelStrategy

pl = trainer()  # pytorch_lightning or lightning.pytorch ($STATEKEEPER_TEST_LIGHTNING)
Callback, ModelCheckpoint = pl.Callback, pl.callbacks.ModelCheckpoint


# (typing) the Lightning package is picked at run time
class Sharded(pl.LightningModule):  # type: ignore[name-defined]
    def __init__(self) -> None:
        super().__init__()
        layers = (torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.net = torch.nn.Sequential(*layers)

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in (self.net[0], self.net[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def on_fit_start(self) -> None:
        torch.manual_seed(100 + self.global_rank)  # each rank draws its own dropout masks

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
            os.kill(os.getpid(), signal.SIGKILL)  # every rank, right after that step


def main() -> None:
    where, out, every, kill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    pl.seed_everything(0, verbose=False)
    # every sample alike: the batches do not depend on the order Lightning's distributed
    # sampler resumes in (which differs after a resume, with or without statekeeper); the
    # sharded model, the optimizer and the RNG (dropout) are what this run checks
    data = TensorDataset(torch.randn(1, 8).expand(32, 8), torch.randn(1, 1).expand(32, 1))
    loader = StatefulDataLoader(data, batch_size=4, shuffle=True)
    saves = ModelCheckpoint(dirpath=where, every_n_train_steps=every, save_last=True)
    callbacks: list[Callback] = [StatekeeperCallback(), saves]
    if kill:
        callbacks.append(KillAfter(kill))
    strategy = StatekeeperModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    trainer = pl.Trainer(
        max_steps=12, accelerator="cpu", devices=2, strategy=strategy, logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    model = Sharded()
    trainer.fit(model, loader, ckpt_path="last" if sys.argv[5:6] == ["resume"] else None)
    check_alone()
    full = {f"param/{k}": v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    full["draw"] = torch.rand(4)
    if trainer.global_rank == 0:
        save_file(full, out)


if __name__ == "__main__":
    main()
