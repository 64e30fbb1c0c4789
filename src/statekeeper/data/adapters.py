"""What this package registers with the core's adapter table (:mod:`statekeeper.checkpoint.
adapters`): how data loaders are captured and restored.

- torchdata's ``StatefulDataLoader``: its own state plus its generators', restored in the
  order exact resume needs (:mod:`.torchdata`); each rank's own in a job;
- ``ResumableLoader``: its own ``state_dict``; each rank's own;
- a plain ``torch.utils.data.DataLoader``: refused at save, with the fix (it has no position).
"""

from __future__ import annotations

from typing import Any

import torch

from statekeeper.checkpoint.adapters import PLAIN, STATEFUL, Adapter, Capturing, Kind, register
from statekeeper.data.loader import ResumableLoader
from statekeeper.data.torchdata import (
    capture_loader,
    is_stateful_dataloader,
    loader_generator_list,
    refuse_plain_dataloader,
    restore_loader,
)

__all__ = ["PLAIN_LOADER", "RESUMABLE_LOADER", "STATEFUL_LOADER", "install"]


def _refuse(name: str, obj: Any, ctx: Capturing) -> Any:
    refuse_plain_dataloader(name, obj)
    return PLAIN.capture(name, obj, ctx)  # pragma: no cover - refused above


STATEFUL_LOADER = Adapter(
    "stateful_dataloader",
    Kind.PER_RANK,
    is_stateful_dataloader,
    lambda name, obj, ctx: capture_loader(name, obj),
    lambda name, obj, value, ctx: restore_loader(name, obj, value),
    generators=loader_generator_list,
)
RESUMABLE_LOADER = Adapter(
    "resumable_loader",
    Kind.PER_RANK,
    lambda obj: isinstance(obj, ResumableLoader),
    STATEFUL.capture,
    STATEFUL.restore,
)
PLAIN_LOADER = Adapter(
    "plain_dataloader",
    Kind.REPLICATED,
    lambda obj: isinstance(obj, torch.utils.data.DataLoader) and not is_stateful_dataloader(obj),
    _refuse,
    PLAIN.restore,
)


def install() -> None:
    for adapter in (PLAIN_LOADER, RESUMABLE_LOADER, STATEFUL_LOADER):
        register(adapter)
