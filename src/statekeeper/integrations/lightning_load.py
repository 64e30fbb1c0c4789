"""What ``LightningModule.load_from_checkpoint`` does, for a checkpoint that is a statekeeper
step (written through ``StatekeeperCheckpointIO``).

Lightning's class method reads the checkpoint with ``torch.load`` and never asks the
``CheckpointIO`` plugin, so on a statekeeper step (a directory) it fails with
``IsADirectoryError``; it cannot be redirected without patching Lightning. Call
:func:`load_from_checkpoint` in its place: the checkpoint is read and verified by
statekeeper (no pickle), then handed to Lightning's own loading, so hyper-parameters
(``save_hyperparameters``, overridden by keyword arguments), ``strict`` and the module's
``on_load_checkpoint`` behave as with Lightning's method.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any, TypeVar

import torch

from statekeeper.errors import InvalidArgumentError
from statekeeper.integrations.lightning_io import StatekeeperCheckpointIO
from statekeeper.integrations.lightning_roots import package_of

__all__ = ["load_from_checkpoint"]

M = TypeVar("M")


def _device(map_location: Any) -> torch.device:
    if map_location is None:
        return torch.device("cpu")
    if isinstance(map_location, Mapping):  # {"cuda:0": "cpu"}: what the saved tensors (CPU) map to
        map_location = map_location.get("cpu", "cpu")
    if isinstance(map_location, str | torch.device):
        return torch.device(map_location)
    raise InvalidArgumentError(
        f'map_location must be a device ("cpu", "cuda:0", torch.device) or a dict of them, '
        f"got {type(map_location).__name__}; a statekeeper step's tensors are read on the CPU "
        "and then moved there"
    )


def load_from_checkpoint(
    cls: type[M],
    checkpoint_path: str | os.PathLike[str],
    *,
    map_location: Any = None,
    strict: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> M:
    """``cls.load_from_checkpoint(checkpoint_path, map_location=..., strict=..., **kwargs)``
    for a statekeeper step: a ``LightningModule`` (or ``LightningDataModule``) subclass built
    from the checkpoint's hyper-parameters updated with ``kwargs``, its weights loaded, on
    ``map_location`` (a device; the CPU by default). A URL (``s3://...``) is read with
    ``storage_options``."""
    root = package_of(cls)  # pytorch_lightning or lightning.pytorch: its own loading
    if root is None:
        raise InvalidArgumentError(
            f"load_from_checkpoint builds a LightningModule or LightningDataModule subclass, got "
            f"{cls!r}: pass the class (MyModule), not an instance"
        )
    pl = importlib.import_module(root)
    _load_state = importlib.import_module(f"{root}.core.saving")._load_state
    device = _device(map_location)
    checkpoint = StatekeeperCheckpointIO(storage_options).load_checkpoint(checkpoint_path)
    key = cls.CHECKPOINT_HYPER_PARAMS_KEY  # type: ignore[attr-defined]
    hparams = dict(checkpoint.get(key) or {})
    hparams.update(kwargs)
    checkpoint[key] = hparams
    built: Any
    if issubclass(cls, pl.LightningDataModule):
        built = _load_state(cls, checkpoint, **kwargs)
    else:
        module: Any = _load_state(cls, checkpoint, strict=strict, **kwargs)
        built = module.to(device)
    return built  # type: ignore[no-any-return]
