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
from statekeeper.interop.opcodes import DisallowedGlobal, restricted_load
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
    """The folder's ``Metadata`` object, built through the allowlist only."""
    path = folder / METADATA
    try:
        md = restricted_load(path.read_bytes(), _allowlist())
    except DisallowedGlobal as exc:
        raise UnsafePickleError(str(path), [exc.name]) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise CorruptCheckpointError(str(path), f"not a DCP metadata file ({exc})") from None
    if not hasattr(md, "state_dict_metadata") or not hasattr(md, "storage_data"):
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


def _read_item(folder: Path, info: Any, where: str, handles: dict[str, Any]) -> Any:
    if getattr(info, "transform_descriptors", None):
        raise UnsupportedFormatError(
            str(folder / info.relative_path), info.transform_descriptors, ["no transforms"]
        )
    file = folder / info.relative_path
    if info.relative_path not in handles:
        if not file.is_file():
            raise CorruptCheckpointError(str(file), "DCP data file listed in .metadata is missing")
        handles[info.relative_path] = open(file, "rb")  # noqa: SIM115 - closed by the caller
    f = handles[info.relative_path]
    f.seek(int(info.offset))
    data = f.read(int(info.length))
    if len(data) != int(info.length):
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
                tensor = torch.empty(tuple(item.size), dtype=item.properties.dtype)
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
                            str(folder / info.relative_path), f"chunk of {fqn!r} has wrong shape"
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
