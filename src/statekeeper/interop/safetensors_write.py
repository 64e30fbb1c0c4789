"""Writing safetensors files for ``convert`` and ``export``: tied tensors stored once.

Tensors that share memory as the same view (tied weights) are stored once; every other
name is recorded in the header's ``__metadata__`` as ``"aliases": '{"alias": "stored"}'``
(a JSON string, as metadata values must be strings), which
:func:`statekeeper.interop.safetensors_files.read_safetensors` expands again.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from statekeeper.errors import UnsupportedValueError
from statekeeper.format.safetensors_io import DTYPE_CODES, layout, stream
from statekeeper.progress import Progress

__all__ = ["ALIASES_KEY", "tie_plan", "write_safetensors"]

ALIASES_KEY = "aliases"


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
