"""Tensor shards: deterministic assignment to files and safetensors encoding.

Shards are standard safetensors files named ``tensors-NNNNN.safetensors``. Tensors are
assigned in traversal order; tensors that rarely change come first, in shards of their own,
so their files keep the same name and bytes from step to step: frozen parameters, then the
tensors a save found unchanged since the previous one (``steady``). A shard is closed when
adding the next tensor would pass ``shard_bytes`` (a single larger tensor gets a shard to
itself).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

__all__ = ["Shard", "plan_shards"]

DEFAULT_SHARD_BYTES = 1 << 30


@dataclass(frozen=True)
class Shard:
    """One file's name and the tensor names it holds, in order."""

    file: str
    names: tuple[str, ...]


def plan_shards(
    stored: dict[str, torch.Tensor],
    frozen: Iterable[str],
    shard_bytes: int,
    steady: Iterable[str] = (),
) -> list[Shard]:
    """Assign stored tensors to shard files, deterministically: the ``frozen`` ones first,
    then the ``steady`` ones (unchanged since the last save), then the others."""
    frozen_set = set(frozen)
    steady_set = set(steady) - frozen_set
    groups = (
        [n for n in stored if n in frozen_set],
        [n for n in stored if n in steady_set],
        [n for n in stored if n not in frozen_set and n not in steady_set],
    )
    shards: list[Shard] = []
    for names in groups:
        current: list[str] = []
        size = 0
        for name in names:
            nbytes = stored[name].numel() * stored[name].element_size()
            if current and size + nbytes > shard_bytes:
                shards.append(Shard(f"tensors-{len(shards):05d}.safetensors", tuple(current)))
                current, size = [], 0
            current.append(name)
            size += nbytes
        if current:
            shards.append(Shard(f"tensors-{len(shards):05d}.safetensors", tuple(current)))
    return shards
