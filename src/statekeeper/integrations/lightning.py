"""Lightning (``Trainer``): every checkpoint written as a statekeeper step.

``StatekeeperCheckpointIO`` is a ``CheckpointIO`` plugin: the file Lightning asks for
(``epoch=1-step=300.ckpt``, ``last.ckpt``) becomes a directory of that name holding one
committed statekeeper step (atomic, checksummed, no pickle), numbered by the checkpoint's
``global_step``, at a local path or a URL (``s3://``, ``memory://``: see
:mod:`statekeeper.integrations.lightning_io`). ``ModelCheckpoint`` finds, keeps and removes
such directories as it does files, and ``trainer.fit(..., ckpt_path="last")`` loads them;
:func:`load_from_checkpoint` does what ``LightningModule.load_from_checkpoint`` does.
``StatekeeperCallback`` adds what Lightning's own checkpoint leaves out for an exact, safe
resume: every RNG (each rank's own), optimizer state keyed by parameter name, and the
repairs of Lightning's resume accounting (mid-epoch and at an epoch's end).

Lightning's FSDP2 strategy bypasses ``CheckpointIO``: use
``StatekeeperModelParallelStrategy`` in place of ``ModelParallelStrategy`` (each rank's
shards, one statekeeper step).

Both Lightning packages are supported, ``pytorch_lightning`` and the unified ``lightning``
(``import lightning as L``): the plugin, the callback and the strategy are made as classes of
the package the process has imported (:mod:`statekeeper.integrations.lightning_roots`).

Lightning Fabric: ``Fabric(plugins=[StatekeeperCheckpointIO()])`` makes ``fabric.save`` /
``fabric.load`` write and read statekeeper steps. Fabric saves what it is handed, so hand
it ``NamedOptimizer(optimizer, model)`` (state by parameter name), ``LoaderState(loader)``
(a torchdata loader's exact position) and ``statekeeper.RNGState()`` last (Fabric loads in
the dict's order: the RNG must come after the loader).

What a checkpoint holds must be storable without pickle: tensors, numbers, strings, lists,
tuples, dicts. Hyper-parameters (``save_hyperparameters``) are stored when they are such
values (Lightning's ``AttributeDict`` is stored as a plain dict); anything else (an
``argparse.Namespace``, a class, a function) is refused with an ``UnsupportedValueError``
naming it: pass ``save_hyperparameters(ignore=[...])`` for it, or store plain values.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch

from statekeeper.errors import LoadStateError
from statekeeper.integrations.held import LoaderState, NamedOptimizer
from statekeeper.integrations.lightning_boundary import as_next_epoch, start_epoch
from statekeeper.integrations.lightning_epoch import loader_states, resumed_mid_epoch
from statekeeper.integrations.lightning_fsdp import StatekeeperModelParallelStrategy
from statekeeper.integrations.lightning_io import StatekeeperCheckpointIO
from statekeeper.integrations.lightning_load import load_from_checkpoint
from statekeeper.integrations.lightning_ranks import SharedRankStateWarning, gather, pick
from statekeeper.integrations.lightning_roots import ByPackage, imported, settled
from statekeeper.integrations.lightning_warn import warn_inexact
from statekeeper.state.optimizer import parameter_names, to_named, to_positional
from statekeeper.state.rng import RNGState

__all__ = [
    "LoaderState",
    "NamedOptimizer",
    "SharedRankStateWarning",
    "StatekeeperCallback",
    "StatekeeperCheckpointIO",
    "StatekeeperModelParallelStrategy",
    "load_from_checkpoint",
]

_RNG = "statekeeper_rng"
_OPTIMIZERS = "statekeeper_optimizer_states"  # name-keyed, in place of "optimizer_states"


def _callbacks() -> tuple[type, ...]:
    return tuple(importlib.import_module(f"{r}.callbacks").Callback for r in imported())


class StatekeeperCallback(ByPackage):
    """What Lightning's own checkpoint leaves out for an exact, safe resume.

    Made, it is a ``Callback`` of the Lightning package this process has imported
    (``pytorch_lightning``, ``lightning.pytorch``, or both:
    :mod:`statekeeper.integrations.lightning_roots`).

    - Every RNG (Python, numpy, torch, CUDA), restored where the run that saved stood: for
      a checkpoint saved mid-epoch, as the resumed run starts training, after Lightning
      has made the data iterator (which draws from torch's generator, as the saving run
      had made it before it saved) and before the first batch is fetched; for one saved as
      an epoch ended, as the next epoch starts (before its iterator is made, as in the
      saving run).
    - Optimizer state keyed by parameter name, not by position (single-device and DDP
      strategies): saved by name, and mapped onto the live optimizers' positions before
      Lightning loads them, every mismatch an error.
    - The data order of the rest of an epoch resumed mid-way, which Lightning draws from
      another epoch's permutation (:mod:`statekeeper.integrations.lightning_epoch`).
    """

    _lightning = staticmethod(_callbacks)

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None
        self._loaded: dict[str, Any] | None = None
        self._resumed = False  # loaded a checkpoint to resume from
        self._loaders: list[Any] | None = None
        self._boundary: list[Any] | None = None  # an epoch-end checkpoint's loader states

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint[_RNG] = _loadable(RNGState().state_dict())
        gather(checkpoint, checkpoint[_RNG])  # every rank's own (DDP), not rank 0's alone
        if _by_name(trainer, checkpoint):
            names = parameter_names({"model": pl_module})
            # under a key of its own: resumed without this callback, Lightning finds no
            # optimizer state and says so, instead of loading names as positions
            del checkpoint["optimizer_states"]
            checkpoint[_OPTIMIZERS] = [
                to_named(f"optimizer_{i}", opt, names) for i, opt in enumerate(trainer.optimizers)
            ]

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn != "fit":  # TrainerFn.FITTING (either package); not validate, test...
            return
        pick(checkpoint, _RNG)  # this rank's RNG and loader states (DDP)
        self._pending = checkpoint.get(_RNG)
        self._loaded = checkpoint  # its optimizer states are mapped once the optimizers exist
        self._resumed = True
        self._boundary = as_next_epoch(checkpoint)  # saved as an epoch ended: the next begins
        self._loaders = loader_states(checkpoint)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._pending = self._loaded = self._loaders = self._boundary = None  # never carried on
        self._resumed = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        warn_inexact(trainer)  # what cannot be exact, said before the first step
        if not self._resumed:
            return
        resumed_mid_epoch(trainer, self._loaders)  # Lightning issue #21938
        if trainer.fit_loop.epoch_loop.batch_progress.current.ready > 0:
            self._restore()  # mid-epoch: after the iterator is made, before the next fetch

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        loaded, self._loaded = self._loaded, None
        if loaded is None:
            return
        saved = loaded.get(_OPTIMIZERS, [])
        if not saved:
            return
        if len(saved) != len(trainer.optimizers):
            raise LoadStateError(
                f"the checkpoint holds {len(saved)} optimizer(s), the run has "
                f"{len(trainer.optimizers)}"
            )
        names = parameter_names({"model": pl_module})
        positional, problems = [], []
        for i, (state, opt) in enumerate(zip(saved, trainer.optimizers, strict=True)):
            mapped, found = to_positional(f"optimizer_{i}", state, opt, names)
            positional.append(mapped)
            problems += found
        if problems:
            raise LoadStateError(
                "the checkpoint's optimizer state does not fit the run's optimizers: "
                + "; ".join(problems[:10])
            )
        loaded["optimizer_states"] = positional  # what Lightning loads next
        del loaded[_OPTIMIZERS]

    def _restore(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            RNGState().load_state_dict(_numpy_back(pending))

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self._boundary is not None:  # resumed from an epoch's end (lightning_boundary)
            loaders, self._boundary = self._boundary, None
            start_epoch(trainer, loaders, self._restore)
        elif trainer.fit_loop.epoch_loop.batch_progress.current.ready == 0:
            self._restore()  # a new epoch: saved as the last one ended

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._restore()  # saved mid-epoch: its iterator was made before it saved


def _loadable(rng: dict[str, Any]) -> dict[str, Any]:
    """The RNG state with numpy's key array as a tensor: a checkpoint written through
    Lightning's own ``CheckpointIO`` (the callback without the plugin) then loads with
    torch's weights-only loading, which refuses numpy arrays."""
    kind, key, *rest = rng["numpy"]
    return {**rng, "numpy": (kind, torch.from_numpy(np.asarray(key, dtype=np.int64)), *rest)}


def _numpy_back(rng: dict[str, Any]) -> dict[str, Any]:
    kind, key, *rest = rng["numpy"]
    if isinstance(key, torch.Tensor):
        key = key.numpy().astype(np.uint32)
    return {**rng, "numpy": (kind, np.asarray(key, dtype=np.uint32), *rest)}


def _by_name(trainer: Any, checkpoint: dict[str, Any]) -> bool:
    """Whether the checkpoint's optimizer states are the live optimizers' own state dicts
    (single device, DDP), which this callback can key by name."""
    plain = type(trainer.strategy).__name__ in ("SingleDeviceStrategy", "DDPStrategy")
    return plain and len(checkpoint.get("optimizer_states", [])) == len(trainer.optimizers)


StatekeeperCallback = settled(StatekeeperCallback)  # type: ignore[misc]  # one package: its subclass
