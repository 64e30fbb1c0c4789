"""Slim inference weights: one module's tensors in one safetensors file.

Only the module's ``state_dict`` goes out: no optimizer, RNG, scheduler, counters or other
values (they are listed as dropped). A ``state_dict`` holds parameters and *persistent*
buffers only, so transient attributes and buffers registered with ``persistent=False`` were
never in the checkpoint. Tied weights (the same memory under two names, such as an
embedding and an output head) are stored once; every other name is recorded in the header
metadata ``"aliases"`` and expanded again by ``statekeeper.read``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from statekeeper.arguments import require_bool, require_callable
from statekeeper.errors import InvalidArgumentError, OutputExistsError
from statekeeper.format.aliases import tie_plan
from statekeeper.format.dtypes import dtype_name
from statekeeper.interop.lightning import WEIGHTS_KEY, is_lightning
from statekeeper.interop.safetensors_write import write_safetensors
from statekeeper.interop.tree import flat_leaves, select, split_tensors, strip_prefixes
from statekeeper.progress import Progress

__all__ = ["DTYPES", "ExportReport", "export", "parse_dtype", "weights_of"]

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}  # fmt: skip


@dataclass(frozen=True)
class ExportReport:
    """What ``export`` wrote."""

    path: str
    key: str | None  # the sub-tree exported (None: the whole state)
    tensors: int  # names in the file, aliases included
    stored: int  # tensors stored (each tied group once)
    aliases: dict[str, str]  # alias -> stored name
    bytes: int
    dtype: str | None
    dropped: tuple[str, ...]  # non-tensor leaves left out


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """``"bf16"`` -> ``torch.bfloat16``; only floating dtypes are accepted."""
    if name is None or isinstance(name, torch.dtype):
        if isinstance(name, torch.dtype) and name not in DTYPES.values():
            raise InvalidArgumentError(f"dtype must be bfloat16, float16 or float32, not {name}")
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise InvalidArgumentError(f"dtype {name!r} is not one of {', '.join(DTYPES)}") from None


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor | np.ndarray)


def _module_like(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(k, str) and _is_tensor(v) for k, v in value.items())
    )


def weights_of(state: Mapping[str, Any], key: str | None, where: str) -> tuple[Any, str | None]:
    """The module sub-tree to export: ``key``, else the state itself when it is a flat
    mapping of tensors, a Lightning ``state_dict``, a ``"model"`` entry, or the only
    module-like entry."""
    if key is not None:
        return select(state, key, where), key
    if _module_like(state):
        return state, None
    if is_lightning(state):
        return state[WEIGHTS_KEY], WEIGHTS_KEY
    if isinstance(state.get("model"), Mapping):
        return state["model"], "model"
    candidates = [k for k, v in state.items() if _module_like(v)]
    if len(candidates) == 1:
        return state[candidates[0]], candidates[0]
    shown = ", ".join(map(repr, candidates or list(state)[:20]))
    raise InvalidArgumentError(
        f"{where}: cannot tell which entry holds the model weights (candidates: {shown}); "
        "pass key=... to choose"
    )


def export(
    path: str | Path | Mapping[str, Any],
    out: str | Path,
    *,
    key: str | None = None,
    dtype: str | torch.dtype | None = None,
    strip: Sequence[str] = (),
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ExportReport:
    """Write the inference weights of ``path`` (a path in any readable format, or a state
    already read) to the safetensors file ``out``.

    ``key`` picks the module sub-tree (default: see :func:`weights_of`); ``dtype``
    (``"bf16"``, ``"fp16"``, ``"fp32"``) casts floating tensors; ``strip`` removes key
    prefixes (pass ``WRAPPER_PREFIXES`` for ``module.`` / ``_orig_mod.``). Tied tensors are
    stored once with their aliases in the metadata; ``statekeeper.read(out)`` gives every
    name back, so ``model.load_state_dict(statekeeper.read(out))`` works. An existing
    ``out`` is replaced only with ``overwrite=True`` (``OutputExistsError`` otherwise).

    Args:
        path: A checkpoint path of any readable format, or a state already read.
        out: The ``.safetensors`` file to write.
        key: The module sub-tree to export; default: the one that holds the model weights.
        dtype: ``"bf16"``, ``"fp16"``, ``"fp32"`` (or a torch dtype) to cast floating tensors to.
        strip: Key prefixes to remove (``WRAPPER_PREFIXES`` for ``module.`` / ``_orig_mod.``).
        overwrite: Replace an existing ``out``.
        progress: ``progress(done, total)`` of the reading.

    Returns:
        An ``ExportReport``: the file written, its tensors and bytes.

    Raises:
        OutputExistsError: ``out`` exists and ``overwrite`` is False.
        InvalidArgumentError: An unknown ``dtype``, or a sub-tree without tensors.
        StepNotFoundError: ``path`` does not exist.
        CorruptCheckpointError: A damaged source.
        UnsafePickleError: A pickle-based source asks for more than tensors.
    """
    from statekeeper.interop.reading import read

    require_bool("overwrite", overwrite)
    require_callable("progress", progress, "progress(done, total)")
    if not overwrite and Path(out).exists():
        raise OutputExistsError(
            f"{out}: the file already exists; pass overwrite=True to replace it", str(out)
        )
    where = str(path) if isinstance(path, str | Path) else "state"
    state = read(path) if isinstance(path, str | Path) else dict(path)
    cast = parse_dtype(dtype)
    tree, used = weights_of(state, key, where)
    tensors, others = split_tensors(strip_prefixes(flat_leaves(tree), tuple(strip)))
    dropped = list(others)
    if not tensors:
        raise InvalidArgumentError(f"{where}: the sub-tree {used!r} holds no tensors to export")
    stored, aliases = tie_plan(tensors)
    if cast is not None:
        stored = {n: t.to(cast) if t.is_floating_point() else t for n, t in stored.items()}
    size = write_safetensors(out, stored, aliases=aliases, metadata={"format": "pt"},
                             progress=progress)  # fmt: skip
    return ExportReport(
        str(out), used, len(tensors), len(stored), aliases, size,
        None if cast is None else dtype_name(cast), tuple(dropped),
    )  # fmt: skip
