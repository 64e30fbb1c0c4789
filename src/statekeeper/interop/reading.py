"""One entry point over every reader: the format of a path and its plain nested state."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from statekeeper.arguments import require_callable
from statekeeper.catalog.detect import Format, foreign_format
from statekeeper.catalog.foreign_files import size_of
from statekeeper.catalog.location import PathOrStorage
from statekeeper.checkpoint.load import read_statekeeper
from statekeeper.errors import InvalidArgumentError
from statekeeper.interop.accelerate import read_accelerate
from statekeeper.interop.dcp import read_dcp
from statekeeper.interop.lightning import read_lightning
from statekeeper.interop.pickled import load_torch_file
from statekeeper.interop.safetensors_files import read_hf, read_safetensors
from statekeeper.progress import Progress

__all__ = ["ROOT_KEY", "read", "read_foreign"]

ROOT_KEY = "state"
"""A torch.save file whose top level is not a dict is returned as ``{ROOT_KEY: obj}``."""


def read_foreign(
    path: str | os.PathLike[str], fmt: Format, *, step: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The plain nested state of a foreign checkpoint, tensors on the CPU."""
    if step is not None:
        raise InvalidArgumentError(
            f"{path} is a {fmt} checkpoint, which has no steps; do not pass step={step}"
        )
    p = Path(path)
    state: Any
    if fmt is Format.SAFETENSORS:
        state = read_safetensors(p)
    elif fmt is Format.HUGGINGFACE:
        state = read_hf(p, progress)
    elif fmt is Format.DCP:
        state = read_dcp(p, progress)
    elif fmt is Format.ACCELERATE:
        state = read_accelerate(p, progress)
    elif fmt is Format.LIGHTNING:
        state = read_lightning(p)
    elif fmt is Format.TORCH:
        state = load_torch_file(p)
    else:
        raise InvalidArgumentError(f"{path}: {fmt} is not a foreign format")
    if progress is not None and fmt in (Format.SAFETENSORS, Format.LIGHTNING, Format.TORCH):
        size = size_of(p)
        progress(size, size)
    return state if isinstance(state, dict) else {ROOT_KEY: state}


def read(
    path: PathOrStorage, *, step: int | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """The plain nested state of a checkpoint (tensors on CPU), no live objects needed.

    ``path`` is a run directory (the newest step, or ``step``) or a step directory.
    Tensors that shared memory when saved share it again. A local path in another format
    (``torch.save`` file, safetensors file or folder, Lightning, Accelerate, DCP) is read
    safely by the readers of this package (see docs/interop.md).

    Args:
        path: A run directory (its newest step, or ``step``) or a step directory (a
            path, a URL or a :class:`Storage`), or a checkpoint of another format (a local
            path).
        step: The step of a run to read; foreign checkpoints have none.
        progress: ``progress(done, total)`` with the bytes read.

    Returns:
        The nested state: dicts, lists and plain values, tensors on the CPU.

    Raises:
        StepNotFoundError: No such path, or no such committed step.
        CorruptCheckpointError: A file is damaged or fails its checksum.
        UnsupportedFormatError: A manifest this release cannot read.
        UnsafePickleError: A pickle-based file asks for more than tensors.
        InvalidArgumentError: ``step`` for a foreign checkpoint, or a path of no known format.
    """
    require_callable("progress", progress, "progress(done, total)")
    foreign = foreign_format(path)
    if foreign is not None:
        return read_foreign(*foreign, step=step, progress=progress)
    return read_statekeeper(path, step=step, progress=progress)
