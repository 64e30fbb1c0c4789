"""Finding the data loaders of a training state (shared by the loader rules)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from statekeeper.data.loader import ResumableLoader

__all__ = ["loaders", "sampler_of"]


def loaders(
    state: Mapping[str, Any],
) -> Iterator[tuple[str, Any, torch.utils.data.DataLoader[Any]]]:
    """(entry name, the entry, the DataLoader inside it) for every loader entry."""
    for name, obj in state.items():
        if isinstance(obj, ResumableLoader):
            yield name, obj, obj.loader
        elif isinstance(obj, torch.utils.data.DataLoader):
            yield name, obj, obj


def sampler_of(loader: torch.utils.data.DataLoader[Any]) -> Any:
    batch_sampler = loader.batch_sampler
    return getattr(batch_sampler, "sampler", None) or loader.sampler
