"""Safetensors files and Hugging Face folders, read zero-copy and defensively.

Files are opened through :mod:`statekeeper.interop.foreign_files` (regular files only,
links followed, names from an index confined to its folder); the header's length is checked
against :data:`~statekeeper.format.jsondoc.MAX_HEADER_BYTES` and the file's size before it
is read, an index against :data:`~statekeeper.format.jsondoc.MAX_INDEX_BYTES`, and every
JSON document goes through :func:`~statekeeper.format.jsondoc.parse_json`. Aliases written
by :mod:`statekeeper.interop.safetensors_write` (tied weights stored once) are expanded
again, to the very same tensor object, so ``module.load_state_dict(statekeeper.read(path))``
works. Writing lives in :mod:`statekeeper.interop.safetensors_write` (re-exported here).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.jsondoc import MAX_HEADER_BYTES, MAX_INDEX_BYTES, parse_json
from statekeeper.format.safetensors_io import parse
from statekeeper.interop.foreign_files import member, open_file, read_json, size_of
from statekeeper.interop.pickled import load_torch_file
from statekeeper.interop.safetensors_write import ALIASES_KEY, tie_plan, write_safetensors
from statekeeper.progress import Progress
from statekeeper.storage.files import check_name

__all__ = [
    "ALIASES_KEY",
    "WEIGHT_FILES",
    "hf_files",
    "read_hf",
    "read_index",
    "read_metadata",
    "read_safetensors",
    "tie_plan",
    "weight_map",
    "write_safetensors",
]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
MAX_DIMS = 64
"""Most dimensions a tensor of a foreign safetensors file may have."""


def read_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (empty when it has none)."""
    fd = open_file(Path(path))
    try:
        return _metadata(Path(path), _header(Path(path), fd, os.fstat(fd).st_size))
    finally:
        os.close(fd)


def _header(path: Path, fd: int, size: int) -> dict[str, Any]:
    """The JSON header of the safetensors file open as ``fd``, its length checked against
    :data:`MAX_HEADER_BYTES` and the file's size before it is read."""
    head = os.pread(fd, 8, 0)
    if len(head) < 8:
        raise CorruptCheckpointError(str(path), "shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES:
        raise CorruptCheckpointError(
            str(path), f"header length {n} is larger than the {MAX_HEADER_BYTES} bytes allowed"
        )
    if n > size - 8:
        raise CorruptCheckpointError(str(path), "header length runs past the end of file")
    try:
        header = parse_json(os.pread(fd, n, 8))
    except ValueError as exc:
        raise CorruptCheckpointError(str(path), f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CorruptCheckpointError(str(path), "header is not a JSON object")
    for name, info in header.items():
        shape = info.get("shape") if isinstance(info, dict) and name != "__metadata__" else []
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_DIMS
            or any(type(d) is not int or not 0 <= d < 1 << 63 for d in shape)
        ):
            raise CorruptCheckpointError(str(path), f"tensor {name!r} has an invalid shape")
        if 0 not in shape and math.prod(shape) > size:
            raise CorruptCheckpointError(
                str(path),
                f"tensor {name!r} of shape {shape} needs more than the file's {size} bytes",
            )
    return header


def _metadata(path: Path, header: dict[str, Any]) -> dict[str, str]:
    meta = header.get("__metadata__", {})
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CorruptCheckpointError(str(path), "__metadata__ is not a map of strings")
    return meta


def read_safetensors(path: str | Path, listed_in: str | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of one file (views of a copy-on-write map), aliases expanded.

    ``listed_in`` names the index that lists the file (a missing file is then corrupt).
    """
    p = Path(path)
    fd = open_file(p, listed_in)
    try:
        size = os.fstat(fd).st_size
        meta = _metadata(p, _header(p, fd, size))
        data = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    try:
        tensors = parse(data)
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise CorruptCheckpointError(str(p), f"not a valid safetensors file: {exc}") from None
    if ALIASES_KEY in meta:
        _expand_aliases(p, tensors, meta[ALIASES_KEY])
    return tensors


def _expand_aliases(path: Path, tensors: dict[str, torch.Tensor], text: str) -> None:
    problem = f"metadata {ALIASES_KEY!r} is malformed or names a missing tensor"
    try:
        aliases = parse_json(text)
    except ValueError as exc:
        raise CorruptCheckpointError(str(path), f"{problem} ({exc})") from None
    if not isinstance(aliases, dict):
        raise CorruptCheckpointError(str(path), f"{problem} (not a JSON object)")
    for alias, base in aliases.items():
        if not isinstance(base, str) or base not in tensors:
            raise CorruptCheckpointError(str(path), f"{problem}: {base!r}")
        tensors[alias] = tensors[base]


def _load_shard(path: Path, listed_in: str | None = None) -> Mapping[str, Any]:
    if path.name.endswith(".safetensors"):
        return read_safetensors(path, listed_in)
    loaded = load_torch_file(path, listed_in=listed_in)
    if not isinstance(loaded, Mapping):
        raise CorruptCheckpointError(str(path), "a weights shard that is not a mapping")
    return loaded


def weight_map(path: Path) -> dict[str, str]:
    """Tensor name -> shard file name, the ``weight_map`` of the index ``path``; every file
    name is checked to be a plain name (so it can only name a file beside the index)."""
    index = read_json(path, MAX_INDEX_BYTES, "weight index")
    found = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(found, dict):
        raise CorruptCheckpointError(str(path), "not a weight index (no 'weight_map' object)")
    for file in found.values():
        check_name(str(path), file)
    return found


def read_index(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """The tensors of a sharded checkpoint described by ``*.index.json`` (``weight_map``)."""
    p = Path(path)
    names = weight_map(p)
    by_file: dict[str, list[str]] = {}
    for name, file in names.items():
        by_file.setdefault(file, []).append(name)
    sizes = {file: size_of(member(p.parent, p, file), p.name) for file in by_file}
    total = sum(sizes.values())
    done = 0
    out: dict[str, Any] = {}
    for file, held in by_file.items():
        shard_path = p.parent / file
        shard = _load_shard(shard_path, p.name)
        for name in held:
            if name not in shard:
                raise CorruptCheckpointError(
                    str(shard_path), f"tensor {name!r} listed in {p.name} is not in it"
                )
            out[name] = shard[name]
        done += sizes[file]
        if progress is not None:
            progress(done, total)
    return {name: out[name] for name in names}


def hf_files(folder: Path) -> list[Path]:
    """The weight files of a model folder: its index, else one known weights file, else
    every ``.safetensors`` file. A name that exists counts whatever it is (a FIFO or a
    device is then refused when it is opened, not skipped)."""
    for name in (*_INDEXES, *WEIGHT_FILES):
        if os.path.lexists(folder / name):
            return [folder / name]
    indexes = sorted(folder.glob("*.index.json"))
    if indexes:
        return indexes[:1]
    return sorted(folder.glob("*.safetensors"))


def read_hf(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """An index file, or a folder of model weights (see :func:`hf_files`)."""
    p = Path(path)
    if not p.is_dir():
        return read_index(p, progress)
    out: dict[str, Any] = {}
    for file in hf_files(p):
        if file.name.endswith(".index.json"):
            part: Mapping[str, Any] = read_index(file, progress)
        else:
            part = _load_shard(file)
        for name in part:
            if name in out:
                raise CorruptCheckpointError(str(file), f"tensor {name!r} is in two files")
        out.update(part)
    return out
