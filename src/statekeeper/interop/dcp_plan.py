"""What a DCP ``.metadata`` may claim, checked against the folder before anything is read.

The metadata object was built through an allowlist, but every field of it is still the
file's word: any type, any number. :func:`plan_dcp` turns it into a plain plan, or raises
``CorruptCheckpointError`` naming ``.metadata`` (or the data file) and what is wrong:

- every data file name is one plain path component (no ``/``, no ``..``, not absolute);
- every stored item (``offset``, ``length``) lies inside its data file's real size;
- every tensor has a sane size and dtype; its chunks tile it, and each chunk's item holds at
  least the chunk's bytes (``torch.save`` adds a little to each);
- the bytes all tensors need fit in the data files (so no item is counted twice to make a
  tensor look backed): nothing is allocated beyond the bytes really present;
- the planner's key paths (nesting of the state) are at most
  :data:`~statekeeper.format.jsondoc.MAX_DEPTH` keys of str or int >= 0 (the reader bounds
  the gaps that list indices may open).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from statekeeper.catalog.foreign_files import MAX_DIMS, member, size_of
from statekeeper.errors import CorruptCheckpointError, UnsupportedFormatError
from statekeeper.format.jsondoc import MAX_DEPTH
from statekeeper.format.sharding import tiling_problem

__all__ = ["METADATA", "BytesEntry", "Chunk", "DcpPlan", "Item", "TensorEntry", "plan_dcp"]

METADATA = ".metadata"
Key = str | int


@dataclass(frozen=True)
class Item:
    """A stored item: ``length`` bytes at ``offset`` of the data file ``file``."""

    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    item: Item


@dataclass(frozen=True)
class TensorEntry:
    fqn: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True)
class BytesEntry:
    fqn: str
    item: Item


@dataclass(frozen=True)
class DcpPlan:
    entries: tuple[TensorEntry | BytesEntry, ...]
    paths: dict[str, tuple[Key, ...]]  # fqn -> where it goes in the nested state
    total: int  # bytes of the items to read


def _ints(value: object, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, tuple | list) or len(value) > MAX_DIMS:
        raise CorruptCheckpointError(where, f"{what} is not a list of at most {MAX_DIMS} ints")
    if any(type(n) is not int or not 0 <= n < 1 << 63 for n in value):
        raise CorruptCheckpointError(where, f"{what} {tuple(value)!r} is not a list of sizes")
    return tuple(value)


def _count(value: object, fqn: str, where: str) -> int:
    if type(value) is not int:
        raise CorruptCheckpointError(where, f"item {fqn!r} has an offset or length {value!r}")
    if value < 0:
        raise CorruptCheckpointError(where, f"item {fqn!r} has a negative offset or length")
    return value


class _Planner:
    def __init__(self, folder: Path, md: Any) -> None:
        self.folder = folder
        self.where = str(folder / METADATA)
        self.sizes: dict[str, int] = {}
        self.storage: dict[tuple[str, tuple[int, ...] | None], Any] = {}
        storage_data = md.storage_data
        if not isinstance(storage_data, Mapping):
            raise CorruptCheckpointError(self.where, "storage_data is not a mapping")
        for index, info in storage_data.items():
            fqn = getattr(index, "fqn", None)
            offset = getattr(index, "offset", None)
            if not isinstance(fqn, str):
                raise CorruptCheckpointError(self.where, f"a storage key {index!r} has no name")
            at = None if offset is None else _ints(offset, f"offset of {fqn!r}", self.where)
            self.storage[(fqn, at)] = info

    def item(self, fqn: str, offsets: tuple[int, ...] | None) -> Item:
        """The stored item of ``fqn`` at ``offsets``, checked to lie inside its data file."""
        info = self.storage.get((fqn, offsets))
        if info is None:
            what = "a chunk of " if offsets is not None else ""
            raise CorruptCheckpointError(self.where, f"no data for {what}{fqn!r}")
        file = member(self.folder, self.folder / METADATA, getattr(info, "relative_path", None))
        descriptors = getattr(info, "transform_descriptors", None)
        if descriptors:
            raise UnsupportedFormatError(str(file), descriptors, ["no transforms"])
        offset = _count(getattr(info, "offset", None), fqn, self.where)
        length = _count(getattr(info, "length", None), fqn, self.where)
        if file.name not in self.sizes:
            self.sizes[file.name] = size_of(file, METADATA)
        size = self.sizes[file.name]
        if offset + length > size:
            raise CorruptCheckpointError(
                str(file),
                f"the item of {fqn!r} ({length} bytes at {offset}) runs past the end of the "
                f"file ({size} bytes)",
            )
        return Item(file.name, offset, length)

    def tensor(self, fqn: str, meta: Any) -> TensorEntry:
        shape = _ints(meta.size, f"size of tensor {fqn!r}", self.where)
        dtype = getattr(meta.properties, "dtype", None)
        if not isinstance(dtype, torch.dtype):
            raise CorruptCheckpointError(self.where, f"tensor {fqn!r} has no dtype")
        chunks: list[Chunk] = []
        for chunk in meta.chunks:
            offsets = _ints(chunk.offsets, f"chunk offsets of {fqn!r}", self.where)
            sizes = _ints(chunk.sizes, f"chunk sizes of {fqn!r}", self.where)
            item = self.item(fqn, offsets)
            need = math.prod(sizes) * dtype.itemsize
            if item.length < need:
                raise CorruptCheckpointError(
                    str(self.folder / item.file),
                    f"the item of a chunk of {fqn!r} holds {item.length} bytes, less than the "
                    f"{need} bytes of the chunk",
                )
            chunks.append(Chunk(offsets, sizes, item))
        problem = tiling_problem(shape, [(c.offsets, c.sizes) for c in chunks])
        if problem is not None:
            raise CorruptCheckpointError(self.where, f"the chunks of tensor {fqn!r} {problem}")
        return TensorEntry(fqn, shape, dtype, tuple(chunks))

    def paths(self, mapping: object, fqns: list[str]) -> dict[str, tuple[Key, ...]]:
        if mapping is None or (isinstance(mapping, Mapping) and not mapping):
            return {}
        if not isinstance(mapping, Mapping):
            raise CorruptCheckpointError(self.where, "planner_data is not a mapping")
        out: dict[str, tuple[Key, ...]] = {}
        for fqn in fqns:
            path = mapping.get(fqn, (fqn,))
            if (
                not isinstance(path, tuple | list)
                or not 0 < len(path) <= MAX_DEPTH
                or any(not isinstance(k, str) and type(k) is not int for k in path)
                or any(type(k) is int and not 0 <= k < 1 << 63 for k in path)
            ):
                raise CorruptCheckpointError(
                    self.where, f"the planner's key path for {fqn!r} is malformed"
                )
            out[fqn] = tuple(path)
        return out


def plan_dcp(folder: Path, md: Any) -> DcpPlan:
    """The checked plan of a DCP folder whose metadata is ``md`` (see the module's doc)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    where = str(folder / METADATA)
    try:
        planner = _Planner(folder, md)
        items = md.state_dict_metadata
        if not isinstance(items, Mapping):
            raise CorruptCheckpointError(where, "state_dict_metadata is not a mapping")
        entries: list[TensorEntry | BytesEntry] = []
        needed = total = 0
        for fqn, meta in items.items():
            if not isinstance(fqn, str):
                raise CorruptCheckpointError(where, f"entry name {fqn!r} is not a str")
            if isinstance(meta, TensorStorageMetadata):
                entry = planner.tensor(fqn, meta)
                needed += math.prod(entry.shape) * entry.dtype.itemsize
                total += sum(c.item.length for c in entry.chunks)
                entries.append(entry)
            elif isinstance(meta, BytesStorageMetadata):
                item = planner.item(fqn, None)
                total += item.length
                entries.append(BytesEntry(fqn, item))
            else:
                raise CorruptCheckpointError(where, f"entry {fqn!r} is of an unknown kind")
        held = sum(planner.sizes.values())
        if needed > held:
            raise CorruptCheckpointError(
                where, f"the tensors need {needed} bytes but the data files hold only {held}"
            )
        paths = planner.paths(md.planner_data, list(items))
    except (CorruptCheckpointError, UnsupportedFormatError):
        raise
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        problem = f"malformed DCP metadata ({type(exc).__name__}: {exc})"
        raise CorruptCheckpointError(where, problem) from exc
    return DcpPlan(tuple(entries), paths, total)
