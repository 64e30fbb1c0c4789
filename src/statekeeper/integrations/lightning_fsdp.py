"""Lightning's FSDP2 strategy (``ModelParallelStrategy``), checkpointed by statekeeper.

Lightning's sharded strategies bypass ``CheckpointIO``: with
``save_distributed_checkpoint=True`` every rank writes its shards with
``torch.distributed.checkpoint`` and rank 0 pickles the rest with ``torch.save``.
``StatekeeperModelParallelStrategy`` saves the same checkpoint as one statekeeper step
instead (a collective: every rank writes its own shards, rank 0 commits): the sharded
model and optimizers as live objects (optimizer state keyed by parameter name, each rank's
DTensor shards), each rank's own RNG (``StatekeeperCallback``'s), and everything else
Lightning keeps (loops, callbacks, schedulers, hyper-parameters: rank 0's, as Lightning's
own strategy keeps them) as plain, pickle-free values. Loading reads each rank's shards
back into the live model and optimizers, verified first, and returns the rest to
Lightning. A weights-only checkpoint holds no optimizer state and loads none.
"""

from __future__ import annotations

import importlib
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from statekeeper.catalog.location import resolve_storage
from statekeeper.checkpoint.load import Strict, load
from statekeeper.checkpoint.save import save
from statekeeper.checkpoint.scope import Scope
from statekeeper.distributed.per_rank import PerRank
from statekeeper.errors import InvalidArgumentError
from statekeeper.integrations.held import plain_tree
from statekeeper.integrations.lightning_roots import (
    ByPackage,
    imported,
    made,
    settled,
    trainer_root,
)
from statekeeper.loop.retention import keep_only
from statekeeper.stateful import Value

__all__ = ["StatekeeperModelParallelStrategy"]

_MODEL = "model"
_REST = "lightning"  # the checkpoint less the model, the optimizers and the RNG
_RNG = "statekeeper_rng"  # StatekeeperCallback's entry: each rank's own


def _strategy(root: str) -> type:
    return importlib.import_module(f"{root}.strategies").ModelParallelStrategy  # type: ignore[no-any-return]


def _imported_strategy() -> tuple[type, ...]:
    roots = imported()
    if len(roots) > 1:
        raise InvalidArgumentError(
            "both pytorch_lightning and lightning are imported: a strategy runs one package's "
            "internals, so say which Trainer it is for: "
            'StatekeeperModelParallelStrategy.of("lightning")(...) or '
            '.of("pytorch_lightning")(...)'
        )
    return (_strategy(roots[0]),)


class StatekeeperModelParallelStrategy(ByPackage):
    """``ModelParallelStrategy`` whose checkpoints are statekeeper steps (see the module).

    Made, it is the ``ModelParallelStrategy`` of the Lightning package this process has
    imported (:mod:`statekeeper.integrations.lightning_roots`); with both imported, name it:
    ``StatekeeperModelParallelStrategy.of("lightning")(...)``.
    """

    _lightning = staticmethod(_imported_strategy)

    if TYPE_CHECKING:  # Lightning's strategy attributes, of whichever package it is made

        def __getattr__(self, name: str) -> Any: ...

    @classmethod
    def of(cls, package: str) -> type[Self]:
        """This strategy as a class of ``package`` (``"lightning"`` or
        ``"pytorch_lightning"``), for a process that has imported both."""
        front = cls.__dict__.get("_statekeeper_front", cls)  # the front, made or not
        return made(front, (_strategy(trainer_root(package)),))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self._save_distributed_checkpoint:
            raise InvalidArgumentError(
                "StatekeeperModelParallelStrategy saves sharded checkpoints: "
                "save_distributed_checkpoint=False (one gathered file) is not supported; "
                "export full weights with statekeeper.conversion.export from a saved step instead"
            )

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}  # the live model is saved instead: no state dict gathered for nothing

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return {}  # the live optimizers are saved instead

    def _live(self, optimizers: bool) -> dict[str, Any]:
        live: dict[str, Any] = {_MODEL: self.lightning_module}
        if optimizers:
            for i, opt in enumerate(self.optimizers):
                live[f"optimizer_{i}"] = getattr(opt, "_optimizer", opt)
        return live

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
        rng = PerRank(Value(rest.pop(_RNG, None)))
        state = {**self._live("optimizer_states" in checkpoint), _RNG: rng, _REST: plain_tree(rest)}
        step = int(checkpoint.get("global_step", 0))
        save(run, state, step=step, overwrite=True, scope=Scope.AUTO)
        if self.global_rank == 0:  # a name saved again (last.ckpt) keeps one step; a step
            keep_only(resolve_storage(run), step)  # it cannot remove is warned about
        self.barrier("statekeeper_save")

    def load_checkpoint(
        self, checkpoint_path: str | os.PathLike[str], weights_only: bool | None = None
    ) -> dict[str, Any]:
        run = Path(self.broadcast(str(checkpoint_path)))
        rest: dict[str, Any] = {}
        rng: Value[Any] = Value(None)
        strict = Strict.ALLOW_MISSING  # a weights-only checkpoint holds no optimizer state
        if not getattr(self.lightning_module, "strict_loading", True):
            strict = Strict.PARTIAL
        load(
            run,
            {**self._live(True), _RNG: PerRank(rng), _REST: rest},
            scope=Scope.AUTO,
            strict=strict,
        )
        if rng.value is not None:
            rest[_RNG] = rng.value
        return rest

    def remove_checkpoint(self, filepath: str | os.PathLike[str]) -> None:
        if self.is_global_zero and Path(filepath).exists():
            # renamed first: a kill while it is deleted leaves no half-deleted checkpoint
            aside = Path(filepath).with_name(
                f"{Path(filepath).name}.removing-{uuid.uuid4().hex[:12]}"
            )
            Path(filepath).rename(aside)
            shutil.rmtree(aside)


StatekeeperModelParallelStrategy = settled(StatekeeperModelParallelStrategy)  # type: ignore[misc]  # one package: its subclass
