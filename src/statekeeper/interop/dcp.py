"""torch.distributed.checkpoint (DCP) folders, read without unpickling anything unsafe.

``.metadata`` is a pickle. torch's own reader calls ``pickle.load`` on it; here it goes
through :func:`~statekeeper.interop.opcodes.restricted_load` with an allowlist of exactly
the DCP metadata dataclasses, torch dtypes/sizes/layouts and ``pathlib`` paths. Each item
in the ``__<rank>_<n>.distcp`` files is a ``torch.save`` payload read with
``weights_only=True``. Chunks of sharded tensors are assembled into one CPU tensor; the
nested structure comes back from the planner's key mapping as DCP itself rebuilds it.

Everything the metadata claims is checked against the folder first
(:mod:`statekeeper.interop.dcp_plan`): data file names are plain names of files in the
folder (links are followed, to regular files only), items lie inside their files, and no
tensor is allocated beyond the bytes the data files really hold.
"""

from __future__ import annotations

import itertools
import os
import pathlib
from pathlib import Path
from typing import IO, Any

import torch

from statekeeper.catalog.foreign_files import open_file, read_capped
from statekeeper.errors import CorruptCheckpointError, UnsafePickleError
from statekeeper.interop.dcp_plan import METADATA, BytesEntry, Item, TensorEntry, plan_dcp
from statekeeper.interop.opcodes import DisallowedAttribute, DisallowedGlobal, restricted_load
from statekeeper.interop.pickled import load_torch_bytes
from statekeeper.progress import Progress

__all__ = ["read_dcp", "read_dcp_metadata"]

MAX_METADATA_BYTES = 256 << 20
"""A ``.metadata`` larger than this is refused unread (a few MiB for the largest models)."""


def _allowlist() -> dict[str, object]:
    from torch.distributed.checkpoint import filesystem, metadata

    allowed: dict[str, object] = {}
    for module, names in (
        (metadata, ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                    "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
                    "StorageMeta", "MetadataIndex")),
        (filesystem, ("_StorageInfo",)),
    ):  # fmt: skip
        for name in names:
            allowed[f"{module.__name__}.{name}"] = getattr(module, name)
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
            allowed[f"torch.{name}"] = value
    allowed["torch.Size"] = torch.Size
    allowed["torch.serialization._get_layout"] = torch.serialization._get_layout
    for cls in (pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath, pathlib.Path):
        allowed[f"pathlib.{cls.__name__}"] = cls
    allowed["collections.OrderedDict"] = dict
    return allowed


def read_dcp_metadata(folder: Path) -> Any:
    """The folder's ``Metadata`` object, built through the allowlist only.

    ``UnsafePickleError`` when the pickle asks for anything outside the allowlist (or to set
    a dunder attribute); ``CorruptCheckpointError`` for anything else that goes wrong while
    building it, including errors the allowlisted constructors themselves raise, and for a
    file that is not regular or larger than :data:`MAX_METADATA_BYTES` (refused unread).
    """
    from torch.distributed.checkpoint.metadata import Metadata

    path = folder / METADATA
    data = read_capped(path, MAX_METADATA_BYTES, "DCP metadata")
    try:
        md = restricted_load(data, _allowlist())
    except DisallowedAttribute as exc:
        raise UnsafePickleError(str(path), [], str(exc)) from exc
    except DisallowedGlobal as exc:
        raise UnsafePickleError(str(path), [exc.name]) from exc
    except Exception as exc:  # allowlisted constructors raise anything (RuntimeError, ...)
        problem = f"not a DCP metadata file ({type(exc).__name__}: {exc})"
        raise CorruptCheckpointError(str(path), problem) from exc
    if not isinstance(md, Metadata):
        raise CorruptCheckpointError(str(path), "not a DCP metadata file")
    return md


class _Placer:
    """Places values at key paths, creating dicts for str keys and lists for int keys (as
    DCP's own ``set_element`` does). The ``None`` gaps that list indices open are bounded
    in all by ``gaps``; ``ValueError`` when a path runs into a value or past that bound, or
    when two values would go to the same place."""

    def __init__(self, gaps: int) -> None:
        self.root: dict[Any, Any] = {}
        self.gaps = gaps

    def _slot(self, container: Any, key: Any) -> None:
        if isinstance(container, dict):
            return
        if not isinstance(container, list) or type(key) is not int:
            raise ValueError(f"key {key!r} leads into a value that is not a container")
        missing = key + 1 - len(container)
        if missing > self.gaps:
            raise ValueError(f"list index {key} leaves more gaps than there are entries")
        if missing > 0:
            self.gaps -= missing
            container.extend([None] * missing)

    def place(self, path: tuple[Any, ...], value: Any) -> None:
        container: Any = self.root
        for key, child in itertools.pairwise(path):
            self._slot(container, key)
            fresh = key not in container if isinstance(container, dict) else container[key] is None
            if fresh:
                container[key] = {} if isinstance(child, str) else []
            container = container[key]
        last = path[-1]
        self._slot(container, last)
        taken = last in container if isinstance(container, dict) else container[last] is not None
        if taken:
            raise ValueError("two entries have this key path")
        container[last] = value


def _read_item(folder: Path, item: Item, fqn: str, handles: dict[str, IO[bytes]]) -> Any:
    file = folder / item.file
    if item.file not in handles:
        handles[item.file] = os.fdopen(open_file(file, METADATA), "rb")
    f = handles[item.file]
    f.seek(item.offset)
    data = f.read(item.length)
    if len(data) != item.length:
        raise CorruptCheckpointError(str(file), f"truncated: item {fqn} runs past the end")
    return load_torch_bytes(data, f"{file} (item {fqn})")


def _tensor(folder: Path, entry: TensorEntry, handles: dict[str, IO[bytes]]) -> torch.Tensor:
    """The tensor of ``entry``, assembled from its (checked) chunks."""
    tensor = torch.empty(entry.shape, dtype=entry.dtype)
    for chunk in entry.chunks:
        part = _read_item(folder, chunk.item, entry.fqn, handles)
        target = tensor
        for dim, (o, s) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
            target = target.narrow(dim, o, s)
        if (
            not isinstance(part, torch.Tensor)
            or part.shape != target.shape
            or part.dtype != entry.dtype
        ):
            raise CorruptCheckpointError(
                str(folder / chunk.item.file),
                f"chunk of {entry.fqn!r} has the wrong shape or dtype",
            )
        target.copy_(part)
    return tensor


def read_dcp(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """The whole state of a DCP folder, tensors on the CPU."""
    folder = Path(path)
    plan = plan_dcp(folder, read_dcp_metadata(folder))
    flat: dict[str, Any] = {}
    handles: dict[str, IO[bytes]] = {}
    done = 0
    try:
        for entry in plan.entries:
            if isinstance(entry, BytesEntry):
                flat[entry.fqn] = _read_item(folder, entry.item, entry.fqn, handles)
                done += entry.item.length
            else:
                flat[entry.fqn] = _tensor(folder, entry, handles)
                done += sum(c.item.length for c in entry.chunks)
            if progress is not None:
                progress(done, plan.total)
    finally:
        for handle in handles.values():
            handle.close()
    if not plan.paths:
        return flat
    placer = _Placer(gaps=len(flat) + 1024)
    try:
        for fqn, value in flat.items():
            placer.place(plan.paths[fqn], value)
    except ValueError as exc:
        raise CorruptCheckpointError(
            str(folder / METADATA), f"the planner's key path for {fqn!r} is malformed: {exc}"
        ) from exc
    return placer.root
