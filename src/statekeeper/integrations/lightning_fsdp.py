"""Lightning's FSDP2 strategy (``ModelParallelStrategy``), checkpointed by statekeeper.

Lightning's sharded strategies bypass ``CheckpointIO``: with
``save_distributed_checkpoint=True`` every rank writes its shards with
``torch.distributed.checkpoint`` and rank 0 pickles the rest with ``torch.save``.
``StatekeeperModelParallelStrategy`` saves the same checkpoint as one statekeeper step
instead (a collective: every rank writes its own shards, rank 0 commits): the sharded
model and optimizers as live objects (optimizer state keyed by parameter name, each rank's
DTensor shards), and everything else Lightning keeps (loops, callbacks, schedulers,
hyper-parameters) as plain, pickle-free values. Loading reads each rank's shards back into
the live model and optimizers, verified first, in any world size statekeeper can reshard
to, and returns the rest to Lightning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytorch_lightning.strategies import ModelParallelStrategy

from statekeeper.checkpoint.load import load
from statekeeper.checkpoint.location import committed, resolve_storage
from statekeeper.checkpoint.save import save
from statekeeper.checkpoint.scope import Scope
from statekeeper.integrations.held import plain_tree

__all__ = ["StatekeeperModelParallelStrategy"]

_MODEL = "model"
_REST = "lightning"  # the checkpoint less the model and the optimizers


class StatekeeperModelParallelStrategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` whose checkpoints are statekeeper steps (see the module)."""

    def _live(self) -> dict[str, Any]:
        optimizers = [getattr(o, "_optimizer", o) for o in self.optimizers]
        return {
            _MODEL: self.lightning_module,
            **{f"optimizer_{i}": o for i, o in enumerate(optimizers)},
        }

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        filepath: str | os.PathLike[str],
        storage_options: Any = None,
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                "StatekeeperModelParallelStrategy.save_checkpoint takes no storage_options"
            )
        run = Path(self.broadcast(str(filepath)))
        rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        step = int(checkpoint.get("global_step", 0))
        save(
            run,
            {**self._live(), _REST: plain_tree(rest)},
            step=step,
            overwrite=True,
            scope=Scope.AUTO,
        )
        if self.global_rank == 0:  # a name saved again (last.ckpt) keeps one step
            storage = resolve_storage(run)
            for entry in committed(storage):
                if entry.step != step:
                    storage.remove(entry.name)
        self.barrier("statekeeper_save")

    def load_checkpoint(
        self, checkpoint_path: str | os.PathLike[str], weights_only: bool | None = None
    ) -> dict[str, Any]:
        run = Path(self.broadcast(str(checkpoint_path)))
        rest: dict[str, Any] = {}
        load(run, {**self._live(), _REST: rest}, scope=Scope.AUTO)
        return rest

    def remove_checkpoint(self, filepath: str | os.PathLike[str]) -> None:
        if self.is_global_zero:
            import shutil

            shutil.rmtree(filepath, ignore_errors=True)
