"""torch.distributed.checkpoint (DCP) folders, read without unpickling anything unsafe.

``.metadata`` is a pickle. torch's own reader calls ``pickle.load`` on it; here it goes
through :func:`~statekeeper.interop.opcodes.restricted_load` with an allowlist of exactly
the DCP metadata dataclasses, torch dtypes/sizes/layouts and ``pathlib`` paths. Each item
in the ``__<rank>_<n>.distcp`` files is a ``torch.save`` payload read with
``weights_only=True``. Chunks of sharded tensors are assembled into one CPU tensor; the
nested structure comes back from the planner's key mapping as DCP itself rebuilds it.
"""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from statekeeper.errors import CorruptCheckpointError, UnsafePickleError, UnsupportedFormatError
from statekeeper.format.sharding import tiling_problem
from statekeeper.interop.opcodes import DisallowedAttribute, DisallowedGlobal, restricted_load
from statekeeper.interop.pickled import load_torch_bytes

__all__ = ["read_dcp", "read_dcp_metadata"]

Progress = Callable[[int, int], None]
METADATA = ".metadata"


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
    building it, including errors the allowlisted constructors themselves raise.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    path = folder / METADATA
    data = path.read_bytes()
    try:
        md = restricted_load(data, _allowlist())
    except DisallowedAttribute as exc:
        raise UnsafePickleError(str(path), [], str(exc)) from None
    except DisallowedGlobal as exc:
        raise UnsafePickleError(str(path), [exc.name]) from None
    except Exception as exc:  # allowlisted constructors raise anything (RuntimeError, ...)
        problem = f"not a DCP metadata file ({type(exc).__name__}: {exc})"
        raise CorruptCheckpointError(str(path), problem) from None
    if not isinstance(md, Metadata):
        raise CorruptCheckpointError(str(path), "not a DCP metadata file")
    return md


def _set(root: dict[Any, Any], path: tuple[Any, ...], value: Any) -> None:
    """Place ``value`` at ``path``, creating dicts for str keys and lists for int keys (as
    DCP's own ``set_element`` does)."""
    container: Any = root
    for key, child in itertools.pairwise(path):
        default: Any = {} if isinstance(child, str) else []
        if isinstance(container, dict):
            container = container.setdefault(key, default)
        else:
            while len(container) <= key:
                container.append(None)
            if container[key] is None:
                container[key] = default
            container = container[key]
    last = path[-1]
    if isinstance(container, dict):
        container[last] = value
    else:
        while len(container) <= last:
            container.append(None)
        container[last] = value


def _data_file(folder: Path, relative: object) -> Path:
    """``folder / relative``, which must lie inside ``folder`` (no absolute paths, no ``..``
    or symlinks leading out of it)."""
    if not isinstance(relative, str) or not relative:
        raise CorruptCheckpointError(
            str(folder / METADATA), f"data file name {relative!r} is not a file name"
        )
    file = folder / relative
    if not file.resolve().is_relative_to(folder.resolve()):
        raise CorruptCheckpointError(
            str(folder / METADATA),
            f"data file {relative!r} lies outside the checkpoint folder {str(folder)!r}",
        )
    return file


def _check_tiling(where: str, fqn: str, shape: tuple[int, ...], chunks: list[Any]) -> None:
    """``CorruptCheckpointError`` unless the chunks lie inside ``shape``, do not overlap and
    cover every element (the rules statekeeper's own sharded steps follow)."""
    if any(type(n) is not int or n < 0 for n in shape):
        raise CorruptCheckpointError(where, f"tensor {fqn!r} has an invalid size {shape}")
    boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in chunks]
    problem = tiling_problem(tuple(shape), boxes)
    if problem is not None:
        raise CorruptCheckpointError(where, f"the chunks of tensor {fqn!r} {problem}")


def _read_item(folder: Path, info: Any, where: str, handles: dict[str, Any]) -> Any:
    file = _data_file(folder, info.relative_path)
    if getattr(info, "transform_descriptors", None):
        raise UnsupportedFormatError(str(file), info.transform_descriptors, ["no transforms"])
    offset, length = int(info.offset), int(info.length)
    if offset < 0 or length < 0:
        raise CorruptCheckpointError(
            str(folder / METADATA), f"item {where} has a negative offset or length"
        )
    if info.relative_path not in handles:
        if not file.is_file():
            raise CorruptCheckpointError(str(file), "DCP data file listed in .metadata is missing")
        handles[info.relative_path] = open(file, "rb")  # noqa: SIM115 - closed by the caller
    f = handles[info.relative_path]
    f.seek(offset)
    data = f.read(length)
    if len(data) != length:
        raise CorruptCheckpointError(str(file), f"truncated: item {where} runs past the end")
    return load_torch_bytes(data, f"{file} (item {where})")


def read_dcp(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """The whole state of a DCP folder, tensors on the CPU."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = Path(path)
    md = read_dcp_metadata(folder)
    storage: dict[tuple[str, tuple[int, ...] | None], Any] = {}
    for index, info in dict(md.storage_data).items():
        offset = None if index.offset is None else tuple(index.offset)
        storage[(index.fqn, offset)] = info
    flat: dict[str, Any] = {}
    handles: dict[str, Any] = {}
    items = dict(md.state_dict_metadata)
    total = sum(int(info.length) for info in storage.values())
    done = 0
    try:
        for fqn, item in items.items():
            if isinstance(item, TensorStorageMetadata):
                shape = tuple(item.size)
                _check_tiling(str(folder / METADATA), fqn, shape, list(item.chunks))
                tensor = torch.empty(shape, dtype=item.properties.dtype)
                for chunk in item.chunks:
                    info = storage.get((fqn, tuple(chunk.offsets)))
                    if info is None:
                        raise CorruptCheckpointError(
                            str(folder / METADATA), f"no data for a chunk of {fqn!r}"
                        )
                    part = _read_item(folder, info, fqn, handles)
                    target = tensor
                    for dim, (o, s) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
                        target = target.narrow(dim, o, s)
                    if not isinstance(part, torch.Tensor) or part.shape != target.shape:
                        raise CorruptCheckpointError(
                            str(_data_file(folder, info.relative_path)),
                            f"chunk of {fqn!r} has wrong shape",
                        )
                    target.copy_(part)
                    done += int(info.length)
                flat[fqn] = tensor
            else:
                info = storage.get((fqn, None))
                if info is None:
                    raise CorruptCheckpointError(str(folder / METADATA), f"no data for {fqn!r}")
                flat[fqn] = _read_item(folder, info, fqn, handles)
                done += int(info.length)
            if progress is not None:
                progress(done, total)
    finally:
        for handle in handles.values():
            handle.close()
    mapping = md.planner_data
    if not isinstance(mapping, Mapping) or not mapping:
        return flat
    state: dict[Any, Any] = {}
    for fqn, value in flat.items():
        _set(state, tuple(mapping.get(fqn, (fqn,))), value)
    return state
