"""Converting: any readable checkpoint into a statekeeper step, or into one safetensors file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from statekeeper.arguments import require_bool, require_callable
from statekeeper.catalog.detect import foreign_format
from statekeeper.catalog.location import is_step_dir
from statekeeper.errors import InvalidArgumentError, OutputExistsError
from statekeeper.format.aliases import tie_plan
from statekeeper.interop.safetensors_write import write_safetensors
from statekeeper.interop.tree import flat_leaves, select, split_tensors
from statekeeper.progress import Progress

__all__ = ["ConvertReport", "convert", "entries_for_save", "refuse_same_run"]


@dataclass(frozen=True)
class ConvertReport:
    """What ``convert`` wrote: a step directory or a safetensors file."""

    source: str
    source_format: str
    path: str
    kind: str  # "statekeeper" or "safetensors"
    step: int | None
    entries: tuple[str, ...]  # top-level entries saved (statekeeper) or ()
    tensors: int
    bytes: int
    aliases: dict[str, str]  # safetensors: alias -> stored name
    dropped: tuple[str, ...]  # safetensors: non-tensor leaves left out
    wrapped_as: str | None  # statekeeper: the entry the whole source was put under


def refuse_same_run(path: str | Path, out: str | Path) -> None:
    """``InvalidArgumentError`` when ``out`` is the run that ``path`` (a statekeeper run or
    one of its steps) belongs to, under any spelling: converting would add a step to it."""
    if not isinstance(path, str | Path) or not isinstance(out, str | Path):
        return
    source = Path(path)
    run = source.parent if is_step_dir(source) else source
    if os.path.realpath(run) == os.path.realpath(out):
        raise InvalidArgumentError(
            f"{path} and {out} are the same run: converting it into itself would add a step "
            "to the run it reads. Pass another destination directory (or a .safetensors file)"
        )


def _valid_name(name: object) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and not name.startswith("$")


def entries_for_save(
    state: Mapping[Any, Any], key: str | None
) -> tuple[dict[str, Any], str | None]:
    """The state as statekeeper entries: as it is when its keys are valid entry names and it
    is not a bare mapping of tensors (a model's weights go under ``"model"``); ``key`` puts
    the whole state under that one name."""
    if key is not None:
        if not _valid_name(key):
            raise InvalidArgumentError(f"entry name {key!r} must be non-empty, without '/' or '$'")
        return {key: dict(state)}, key
    weights = bool(state) and all(isinstance(v, torch.Tensor | np.ndarray) for v in state.values())
    if weights:
        return {"model": dict(state)}, "model"
    if all(_valid_name(k) for k in state):
        return {str(k): v for k, v in state.items()}, None
    return {"state": dict(state)}, "state"


def convert(
    path: str | Path,
    out: str | Path,
    *,
    out_step: int = 0,
    key: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    write_progress: Progress | None = None,
) -> ConvertReport:
    """Convert ``path`` (any format ``statekeeper.read`` reads) into ``out``.

    ``out`` ending in ``.safetensors`` gets one safetensors file with every tensor, keys
    joined with ``.`` (``key`` selects a sub-tree first); plain values cannot go there and
    are listed in ``dropped``. Any other ``out`` is a run directory that gets step ``out_step``,
    written by ``statekeeper.save`` (atomic, checksummed, tensors streamed from the source's
    memory map); ``key`` names the single entry to put the whole source under.

    ``overwrite`` allows replacing what is there: the step ``out_step`` of the run, or the whole
    ``.safetensors`` file. Without it, an existing step is a ``StepExistsError`` and an
    existing file an ``OutputExistsError`` (both ``FileExistsError``; the first a kind of
    the second), raised before the source is read.

    ``progress(done, total)`` follows the reading, ``write_progress`` the writing.

    Args:
        path: A checkpoint of any format :func:`read` reads.
        out: A run directory (gets step ``out_step``) or a ``.safetensors`` file.
        out_step: The step written into a run directory.
        key: For a safetensors output, the sub-tree to write; for a run, the single entry to
            put the whole source under.
        overwrite: Replace the step of the run, or the whole ``.safetensors`` file.
        progress: ``progress(done, total)`` of the reading.
        write_progress: ``progress(done, total)`` of the writing.

    Returns:
        A ``ConvertReport``: what was written and the plain values ``dropped``.

    Raises:
        StepExistsError: The step exists and ``overwrite`` is False (raised before the source
            is read).
        OutputExistsError: ``out`` is an existing file and ``overwrite`` is False.
        InvalidArgumentError: An invalid ``key`` or step.
        StepNotFoundError: ``path`` does not exist.
        CorruptCheckpointError: A damaged source.
        UnsafePickleError: A pickle-based source asks for more than tensors.
    """
    from statekeeper.checkpoint.save import save
    from statekeeper.interop.reading import read

    require_bool("overwrite", overwrite)
    require_callable("progress", progress, "progress(done, total)")
    require_callable("write_progress", write_progress, "write_progress(done, total)")
    to_file = str(out).endswith(".safetensors")
    if not to_file:
        refuse_same_run(path, out)
    if to_file and not overwrite and Path(out).exists():
        raise OutputExistsError(
            f"{out}: the file already exists; pass overwrite=True to replace it", str(out)
        )
    found = foreign_format(path)
    fmt = found[1].value if found else "statekeeper"
    state = read(path, progress=progress)
    if to_file:
        tree = select(state, key, str(path)) if key is not None else state
        tensors, others = split_tensors(flat_leaves(tree))
        dropped = list(others)
        stored, aliases = tie_plan(tensors)
        size = write_safetensors(
            out, stored, aliases=aliases, metadata={"format": "pt"}, progress=write_progress
        )
        return ConvertReport(
            str(path), fmt, str(out), "safetensors", None, (), len(tensors), size, aliases,
            tuple(dropped), None,
        )  # fmt: skip
    entries, wrapped = entries_for_save(state, key)
    info = save(out, entries, step=out_step, overwrite=overwrite, progress=write_progress)
    count = len([v for v in flat_leaves(entries).values() if isinstance(v, torch.Tensor)])
    return ConvertReport(
        str(path), fmt, info.path, "statekeeper", info.step, tuple(entries), count, info.bytes,
        {}, (), wrapped,
    )  # fmt: skip
