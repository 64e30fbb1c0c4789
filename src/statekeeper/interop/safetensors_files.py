"""Safetensors files and Hugging Face folders: read (zero-copy) and write (streaming).

Writing stores tensors that share memory as the same view (tied weights) once and records
each other name in the header's ``__metadata__`` as ``"aliases": '{"alias": "stored"}'``
(a JSON string, as metadata values must be strings). Reading expands those aliases again, to
the very same tensor object, so ``module.load_state_dict(statekeeper.read(path))`` works.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from statekeeper.errors import CorruptCheckpointError, UnsupportedValueError
from statekeeper.format.safetensors_io import DTYPE_CODES, layout, parse, stream
from statekeeper.interop.pickled import load_torch_file

__all__ = [
    "ALIASES_KEY",
    "WEIGHT_FILES",
    "hf_files",
    "read_hf",
    "read_index",
    "read_metadata",
    "read_safetensors",
    "tie_plan",
    "write_safetensors",
]

Progress = Callable[[int, int], None]
ALIASES_KEY = "aliases"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def read_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (empty when it has none)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CorruptCheckpointError(str(path), "shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > os.fstat(f.fileno()).st_size - 8:
            raise CorruptCheckpointError(str(path), "header length runs past the end of file")
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            raise CorruptCheckpointError(str(path), f"header is not JSON ({exc})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of one file (views of a copy-on-write map), aliases expanded."""
    p = Path(path)
    meta = read_metadata(p)
    with open(p, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        tensors = parse(data)
    except ValueError as exc:
        raise CorruptCheckpointError(str(p), f"not a valid safetensors file: {exc}") from None
    if ALIASES_KEY in meta:
        try:
            aliases = json.loads(meta[ALIASES_KEY])
            for alias, base in dict(aliases).items():
                tensors[str(alias)] = tensors[str(base)]
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptCheckpointError(
                str(p), f"metadata {ALIASES_KEY!r} is malformed or names a missing tensor: {exc}"
            ) from None
    return tensors


def _load_shard(path: Path) -> Mapping[str, Any]:
    if path.name.endswith(".safetensors"):
        return read_safetensors(path)
    loaded = load_torch_file(path)
    if not isinstance(loaded, Mapping):
        raise CorruptCheckpointError(str(path), "a weights shard that is not a mapping")
    return loaded


def read_index(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """The tensors of a sharded checkpoint described by ``*.index.json`` (``weight_map``)."""
    p = Path(path)
    try:
        index = json.loads(p.read_text())
        weight_map = {str(k): str(v) for k, v in dict(index["weight_map"]).items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(str(p), f"not a weight index ({exc})") from None
    files = list(dict.fromkeys(weight_map.values()))
    total = sum((p.parent / f).stat().st_size for f in files if (p.parent / f).is_file())
    done = 0
    out: dict[str, Any] = {}
    by_file: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        by_file.setdefault(file, []).append(name)
    for file in files:
        shard_path = p.parent / file
        if not shard_path.is_file():
            raise CorruptCheckpointError(str(shard_path), f"shard listed in {p.name} is missing")
        shard = _load_shard(shard_path)
        for name in by_file[file]:
            if name not in shard:
                raise CorruptCheckpointError(
                    str(shard_path), f"tensor {name!r} listed in {p.name} is not in it"
                )
            out[name] = shard[name]
        done += shard_path.stat().st_size
        if progress is not None:
            progress(done, total)
    return {name: out[name] for name in weight_map}


def hf_files(folder: Path) -> list[Path]:
    """The weight files of a model folder: its index, else one known weights file, else
    every ``.safetensors`` file."""
    for name in (*_INDEXES, *WEIGHT_FILES):
        if (folder / name).is_file():
            return [folder / name]
    indexes = sorted(folder.glob("*.index.json"))
    if indexes:
        return indexes[:1]
    return sorted(folder.glob("*.safetensors"))


def read_hf(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """An index file, or a folder of model weights (see :func:`hf_files`)."""
    p = Path(path)
    if p.is_file():
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


def _view_key(t: torch.Tensor) -> tuple[Any, ...] | None:
    if t.numel() == 0 or t.device.type == "meta":
        return None
    storage = t.untyped_storage().data_ptr()
    return (str(t.device), storage, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def tie_plan(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors to store (tied ones once, under the first name) and ``alias -> stored name``.

    Tied means the same view of the same memory (same storage, offset, shape, strides and
    dtype). Tensors that merely overlap (a slice of another) are each stored with their own
    values: safetensors has no views.
    """
    first: dict[tuple[Any, ...], str] = {}
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in tensors.items():
        key = _view_key(t)
        if key is not None and key in first:
            aliases[name] = first[key]
        else:
            if key is not None:
                first[key] = name
            stored[name] = t
    return stored, aliases


def _counted(
    chunks: Iterator[bytes | memoryview], total: int, progress: Progress | None
) -> Iterator[bytes | memoryview]:
    done = 0
    for chunk in chunks:
        yield chunk
        done += len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
        if progress is not None:
            progress(done, total)


def write_safetensors(
    path: str | Path,
    stored: Mapping[str, torch.Tensor],
    *,
    aliases: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> int:
    """Stream ``stored`` into one safetensors file, atomically (temp file, fsync, rename).

    ``aliases`` (see :func:`tie_plan`) go into the metadata under ``"aliases"``. Returns the
    file's size. Raises ``UnsupportedValueError`` for a dtype safetensors cannot hold.
    """
    p = Path(path)
    for name, t in stored.items():
        if t.dtype not in DTYPE_CODES:
            raise UnsupportedValueError(name, t, f"tensors of dtype {t.dtype}")
    for alias, base in (aliases or {}).items():
        if base not in stored or alias in stored:
            raise ValueError(f"alias {alias!r} must name a stored tensor, not {base!r}")
    meta = dict(metadata or {})
    if aliases:
        meta[ALIASES_KEY] = json.dumps(dict(aliases), sort_keys=True)
    tensors = dict(stored)
    plan = layout(tensors, meta)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in _counted(stream(tensors, plan), plan.size, progress):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return plan.size
