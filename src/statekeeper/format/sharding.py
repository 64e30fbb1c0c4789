"""Sharded steps (manifest version 2): global tensors stored as chunks, per-rank state.

A step saved by several processes records, next to the version-1 members:

- ``sharded``: ``{name: {"dtype", "shape", "chunks": [{"tensor", "offsets"}]}}``: the
  global tensor ``name`` (``"model/layers.0.weight"``) is the union of its chunks; each
  chunk is an ordinary stored tensor (listed in ``tensors``, so its file is checksummed)
  placed at ``offsets`` in the global tensor. Chunks tile the tensor without overlap.
- ``ranks``: one JSON skeleton per rank of the saving job, holding that rank's own state
  (RNG, data-loader position); its tensors are ordinary stored tensors too.

The ``state`` skeleton refers to sharded tensors by their global names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from statekeeper.format.values import Json

__all__ = ["Chunk", "ShardedRecord", "Sharding", "assemble", "dtype_from_name"]


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; ``ValueError`` for anything else."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


@dataclass(frozen=True)
class Chunk:
    tensor: str
    offsets: tuple[int, ...]


@dataclass(frozen=True)
class ShardedRecord:
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or any(type(v) is not int or v < 0 for v in value):
        raise ValueError(f"expected a list of non-negative integers, found {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class Sharding:
    """The version-2 members of a manifest."""

    tensors: dict[str, ShardedRecord]
    ranks: list[Json]

    def to_json(self) -> dict[str, Json]:
        return {
            "sharded": {
                name: {
                    "dtype": r.dtype,
                    "shape": list(r.shape),
                    "chunks": [{"tensor": c.tensor, "offsets": list(c.offsets)} for c in r.chunks],
                }
                for name, r in sorted(self.tensors.items())
            },
            "ranks": list(self.ranks),
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Sharding:
        """Parse the members; ``KeyError``/``TypeError``/``ValueError`` when malformed."""
        tensors = {
            str(name): ShardedRecord(
                str(r["dtype"]),
                _ints(r["shape"]),
                tuple(Chunk(str(c["tensor"]), _ints(c["offsets"])) for c in r["chunks"]),
            )
            for name, r in body["sharded"].items()
        }
        ranks = body["ranks"]
        if not isinstance(ranks, list) or not ranks:
            raise ValueError("ranks must be a non-empty list")
        return cls(tensors, list(ranks))


def _no_overlap(name: str, boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
    """``ValueError`` if two chunks overlap: a sweep along the first dimension, so chunks
    split by rows (the usual FSDP layout) are compared only with their neighbours."""
    if not boxes or not boxes[0][0]:
        if len(boxes) > 1:
            raise ValueError(f"sharded scalar {name!r} has {len(boxes)} chunks")
        return
    active: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for start, size in sorted(boxes):
        if 0 in size:
            continue
        active = [(s, z) for s, z in active if s[0] + z[0] > start[0]]
        for s, z in active:
            if all(a < b + m and b < a + n for a, n, b, m in zip(start, size, s, z, strict=True)):
                raise ValueError(f"two chunks of sharded tensor {name!r} overlap")
        active.append((start, size))


def assemble(
    name: str, record: ShardedRecord, chunk: Callable[[str], torch.Tensor]
) -> torch.Tensor:
    """The global tensor from its verified chunks; ``ValueError`` if they do not tile it."""
    dtype = dtype_from_name(record.dtype)
    out = torch.empty(record.shape, dtype=dtype)
    covered = 0
    for c in record.chunks:
        piece = chunk(c.tensor)
        if (
            piece.dtype != dtype
            or len(c.offsets) != len(record.shape)
            or piece.dim() != len(record.shape)
        ):
            raise ValueError(f"chunk {c.tensor!r} does not match sharded tensor {name!r}")
        target = out
        for dim, (start, length) in enumerate(zip(c.offsets, piece.shape, strict=True)):
            if start + length > record.shape[dim]:
                raise ValueError(f"chunk {c.tensor!r} lies outside sharded tensor {name!r}")
            target = target.narrow(dim, start, length)
        target.copy_(piece)
        covered += piece.numel()
    _no_overlap(name, [(c.offsets, tuple(chunk(c.tensor).shape)) for c in record.chunks])
    if covered != math.prod(record.shape):
        raise ValueError(
            f"the chunks of sharded tensor {name!r} cover {covered} of "
            f"{math.prod(record.shape)} elements"
        )
    return out
