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

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statekeeper.format.dtypes import dtype_from_name
from statekeeper.format.malformed import FormatError, as_list, as_object, member
from statekeeper.format.values import Json

if TYPE_CHECKING:
    import torch

__all__ = [
    "Box",
    "Chunk",
    "ShardedRecord",
    "Sharding",
    "assemble",
    "tiling_problem",
]


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
        raise FormatError(f"expected a list of non-negative integers, found {value!r}")
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
        """Parse the members; ``FormatError`` naming the first that does not have its form."""
        tensors = {}
        for name, r in as_object(member(body, "sharded", "manifest"), "sharded").items():
            what = f"sharded tensor {name!r}"
            r = as_object(r, what)
            chunks = []
            for c in as_list(member(r, "chunks", what), f"{what} chunks"):
                c = as_object(c, f"a chunk of {what}")
                chunks.append(
                    Chunk(str(member(c, "tensor", what)), _ints(member(c, "offsets", what)))
                )
            tensors[str(name)] = ShardedRecord(
                str(member(r, "dtype", what)), _ints(member(r, "shape", what)), tuple(chunks)
            )
        ranks = member(body, "ranks", "manifest")
        if not isinstance(ranks, list) or not ranks:
            raise FormatError("ranks must be a non-empty list")
        return cls(tensors, list(ranks))


Box = tuple[tuple[int, ...], tuple[int, ...]]
"""A chunk's offsets and sizes in its tensor."""


def tiling_problem(shape: tuple[int, ...], boxes: list[Box]) -> str | None:
    """Why the chunks ``boxes`` do not tile a tensor of ``shape`` exactly (inside its bounds,
    no overlap, every element covered), or None when they do. Overlap is found by a sweep
    along the first dimension, so chunks split by rows (the FSDP layout) are compared only
    with their neighbours."""
    for start, size in boxes:
        if len(start) != len(shape) or len(size) != len(shape):
            return f"do not match its {len(shape)} dimension(s)"
        for o, n, dim in zip(start, size, shape, strict=True):
            if type(o) is not int or type(n) is not int or o < 0 or n < 0 or o + n > dim:
                return f"do not lie inside its size {shape} (chunk at {start} of {size})"
    if not shape:
        return None if len(boxes) == 1 else f"are {len(boxes)}, not one, for a scalar"
    nonempty = [(start, size) for start, size in boxes if 0 not in size]
    grid = _grid_overlap(shape, nonempty)
    if grid is not None:  # decided on the grid: an overlap, or the coverage
        return grid or _coverage(shape, boxes)
    active: list[Box] = []
    for start, size in sorted(boxes):
        if 0 in size:
            continue
        active = [(s, z) for s, z in active if s[0] + z[0] > start[0]]
        for s, z in active:
            if all(a < b + m and b < a + n for a, n, b, m in zip(start, size, s, z, strict=True)):
                return f"overlap (at {s} and {start})"
        active.append((start, size))
    return _coverage(shape, boxes)


def _coverage(shape: tuple[int, ...], boxes: list[Box]) -> str | None:
    covered = sum(math.prod(size) for _, size in boxes)
    if covered != math.prod(shape):
        return f"cover {covered} of its {math.prod(shape)} elements"
    return None


def _grid_overlap(shape: tuple[int, ...], boxes: list[Box]) -> str | None:
    """Overlap found on the grid that every box edge cuts, in time linear in its cells:
    "" when no cell is covered twice, a problem when one is, None when that grid has far
    more cells than there are boxes (a partition that is no grid: the sweep decides).
    Sharded checkpoints split tensors on a grid (rows, columns, blocks), so a crafted manifest
    of many column chunks costs linear time, not quadratic."""
    cuts = [
        sorted({0, dim, *(s[d] for s, _ in boxes), *(s[d] + z[d] for s, z in boxes)})
        for d, dim in enumerate(shape)
    ]
    cells = math.prod(len(c) - 1 for c in cuts)
    if cells > 8 * len(boxes) + 64:
        return None
    index = [{v: i for i, v in enumerate(c)} for c in cuts]
    strides = [math.prod(len(c) - 1 for c in cuts[d + 1 :]) for d in range(len(cuts))]
    owner: dict[int, int] = {}
    for b, (start, size) in enumerate(boxes):
        spans = [range(index[d][start[d]], index[d][start[d] + size[d]]) for d in range(len(shape))]
        for cell in itertools.product(*spans):
            flat = sum(i * st for i, st in zip(cell, strides, strict=True))
            other = owner.setdefault(flat, b)
            if other != b:
                return f"overlap (at {boxes[other][0]} and {start})"
    return ""


def assemble(
    name: str, record: ShardedRecord, chunk: Callable[[str], torch.Tensor]
) -> torch.Tensor:
    """The global tensor from its verified chunks; ``FormatError`` if they do not tile it."""
    import torch

    dtype = dtype_from_name(record.dtype)
    pieces = [chunk(c.tensor) for c in record.chunks]
    if any(p.dtype != dtype for p in pieces):
        raise FormatError(f"a chunk of sharded tensor {name!r} has another dtype")
    boxes = [(c.offsets, tuple(p.shape)) for c, p in zip(record.chunks, pieces, strict=True)]
    problem = tiling_problem(record.shape, boxes)
    if problem is not None:
        raise FormatError(f"the chunks of sharded tensor {name!r} {problem}")
    out = torch.empty(record.shape, dtype=dtype)
    for (start, size), piece in zip(boxes, pieces, strict=True):
        target = out
        for dim, (offset, length) in enumerate(zip(start, size, strict=True)):
            target = target.narrow(dim, offset, length)
        target.copy_(piece)
    return out
