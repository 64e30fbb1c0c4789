"""Writing safetensors files for ``convert`` and ``export``: tied tensors stored once.

Tensors that share memory as the same view (tied weights, found by
:func:`statekeeper.format.aliases.tie_plan`) are stored once; every other name is recorded
in the header's ``__metadata__`` as ``"aliases": '{"alias": "stored"}'`` (a JSON string, as
metadata values must be strings), which
:func:`statekeeper.interop.safetensors_files.read_safetensors` expands again. The file is
streamed by :mod:`statekeeper.format.safetensors_io` and written atomically by the storage
layer (:func:`statekeeper.storage.local.write_file`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from statekeeper.errors import InvalidArgumentError, UnsupportedValueError
from statekeeper.format.aliases import tie_plan
from statekeeper.format.safetensors_io import layout, stream
from statekeeper.format.torch_dtypes import SUPPORTED_DTYPES
from statekeeper.progress import Progress
from statekeeper.storage.local import write_file

__all__ = ["ALIASES_KEY", "tie_plan", "write_safetensors"]

ALIASES_KEY = "aliases"


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
    file's size. Raises ``UnsupportedValueError`` for a dtype safetensors cannot hold, and
    ``StorageError`` when the file cannot be written (``path`` is then left as it was).
    """
    for name, t in stored.items():
        if t.dtype not in SUPPORTED_DTYPES:
            raise UnsupportedValueError(name, t, f"tensors of dtype {t.dtype}")
    for alias, base in (aliases or {}).items():
        if base not in stored or alias in stored:
            raise InvalidArgumentError(
                f"alias {alias!r} must name a stored tensor, not {base!r}: pass aliases from "
                "tie_plan(stored)"
            )
    meta = dict(metadata or {})
    if aliases:
        meta[ALIASES_KEY] = json.dumps(dict(aliases), sort_keys=True)
    tensors = dict(stored)
    plan = layout(tensors, meta)
    write_file(path, _counted(stream(tensors, plan), plan.size, progress))
    return plan.size
