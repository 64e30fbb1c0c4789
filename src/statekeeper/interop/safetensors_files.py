"""Safetensors files and Hugging Face folders, read zero-copy and defensively.

Files are opened through :mod:`statekeeper.catalog.foreign_files` (regular files only,
links followed, names from an index confined to its folder), mapped copy-on-write and read
by the core's one safetensors reader (:func:`~statekeeper.format.safetensors_header.read_header`:
the header's length against the file and
:data:`~statekeeper.format.jsondoc.MAX_HEADER_BYTES`, bounded JSON, every entry's dtype,
shape and data offsets). What is particular to foreign files is added here: at most
:data:`MAX_DIMS` dimensions, a ``__metadata__`` that is a map of strings, an index against
:data:`~statekeeper.format.jsondoc.MAX_INDEX_BYTES`. Aliases written by
:mod:`statekeeper.interop.safetensors_write` (tied weights stored once) are expanded again,
to the very same tensor object, so ``module.load_state_dict(statekeeper.read(path))``
works. Writing lives in :mod:`statekeeper.interop.safetensors_write` (re-exported here).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from statekeeper.catalog.foreign_files import MAX_DIMS, member, open_file, read_json, size_of
from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.jsondoc import MAX_INDEX_BYTES, parse_json
from statekeeper.format.malformed import FormatError, corrupt
from statekeeper.format.safetensors_header import Header, read_header
from statekeeper.format.safetensors_io import parse
from statekeeper.interop.pickled import load_torch_file
from statekeeper.interop.safetensors_write import ALIASES_KEY, tie_plan, write_safetensors
from statekeeper.progress import Progress
from statekeeper.storage.files import check_name

__all__ = [
    "ALIASES_KEY",
    "MAX_DIMS",
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
_INVALID = "not a valid safetensors file"


def _mapped(path: Path, listed_in: str | None) -> tuple[mmap.mmap | bytes, Header, dict[str, str]]:
    """The file mapped copy-on-write, its checked header and its ``__metadata__``."""
    fd = open_file(path, listed_in)
    try:
        size = os.fstat(fd).st_size
        data = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else b""
    finally:
        os.close(fd)
    try:
        header = read_header(memoryview(data))
    except FormatError as exc:
        raise corrupt(str(path), exc, f"{_INVALID}: {{}}") from exc
    for name, entry in header.entries.items():
        if len(entry.shape) > MAX_DIMS:
            raise CorruptCheckpointError(
                str(path), f"tensor {name!r} has an invalid shape (more than {MAX_DIMS} sizes)"
            )
    return data, header, _metadata(path, header.metadata)


def _metadata(path: Path, meta: object) -> dict[str, str]:
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CorruptCheckpointError(str(path), "__metadata__ is not a map of strings")
    return meta


def read_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (empty when it has none)."""
    return _mapped(Path(path), None)[2]


def read_safetensors(path: str | Path, listed_in: str | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of one file (views of a copy-on-write map), aliases expanded.

    ``listed_in`` names the index that lists the file (a missing file is then corrupt).
    """
    p = Path(path)
    data, header, meta = _mapped(p, listed_in)
    try:
        tensors = parse(data, header)
    except FormatError as exc:
        raise corrupt(str(p), exc, f"{_INVALID}: {{}}") from exc
    if ALIASES_KEY in meta:
        _expand_aliases(p, tensors, meta[ALIASES_KEY])
    return tensors


def _expand_aliases(path: Path, tensors: dict[str, torch.Tensor], text: str) -> None:
    problem = f"metadata {ALIASES_KEY!r} is malformed or names a missing tensor"
    try:
        aliases = parse_json(text)
    except FormatError as exc:
        raise corrupt(str(path), exc, f"{problem} ({{}})") from exc
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
