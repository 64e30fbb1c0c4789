"""Offline weight averaging: the (weighted) mean of several committed checkpoints.

``average_checkpoints`` plans from the manifests alone (every tensor name, shape, dtype and
alias must agree, or one ``KeyMismatchError`` lists every difference), then streams: each
stored tensor is read from the inputs' safetensors shards one checkpoint at a time (every
shard verified against its manifest checksum before first use) and accumulated in float64
(complex128 for complex tensors), then cast back to its dtype. Integer and bool tensors and
every non-tensor value come from the newest input (highest step; on a tie the last path).

Memory: one input tensor and one accumulator at a time, plus the averaged result. The result
is one model's worth of tensors, held until ``statekeeper.save`` writes it (``save`` encodes
from memory), so peak memory is about one model, never one per input.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from statekeeper.arguments import require_bool, require_callable, require_step
from statekeeper.averaging.plan import Input, mismatches, plan_inputs
from statekeeper.averaging.shards import Shards, file_of
from statekeeper.catalog.info import CheckpointInfo
from statekeeper.checkpoint.reader import alias_tensor
from statekeeper.checkpoint.save import save
from statekeeper.errors import InvalidArgumentError, KeyMismatchError, OutputExistsError
from statekeeper.format.dtypes import dtype_from_name
from statekeeper.format.malformed import FormatError, corrupt
from statekeeper.format.manifest import MANIFEST
from statekeeper.incremental.reuse import Incremental
from statekeeper.progress import Progress
from statekeeper.state.tree import unflatten

__all__ = ["average_checkpoints", "normalize_weights"]

_HINT = (
    "Average only checkpoints of one model (same tensor names, shapes, dtypes and tying), "
    "or pick one entry that matches (key=...)."
)


def normalize_weights(weights: Sequence[float] | None, count: int) -> list[float]:
    """The weights of ``count`` inputs scaled to sum to 1 (uniform when ``weights`` is None)."""
    raw = [1.0] * count if weights is None else _raw_weights(weights, count)
    return [w / sum(raw) for w in raw]


def _raw_weights(weights: Sequence[float], count: int) -> list[float]:
    if isinstance(weights, str | bytes) or not isinstance(weights, Sequence):
        raise InvalidArgumentError(f"weights must be a sequence of numbers, got {weights!r}")
    if len(weights) != count:
        raise InvalidArgumentError(
            f"got {len(weights)} weight(s) for {count} checkpoint(s); give one weight each"
        )
    out: list[float] = []
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w < math.inf:
            raise InvalidArgumentError(f"weight {i} is {w!r}; weights must be finite and >= 0")
        out.append(float(w))
    if not 0 < sum(out) < math.inf:
        raise InvalidArgumentError(
            f"weights {list(weights)!r} sum to {sum(out)!r}; they must sum to a finite value > 0"
        )
    return out


def _dtype(ref: Input, name: str, text: str) -> torch.dtype:
    try:
        return dtype_from_name(text)
    except FormatError as exc:
        raise corrupt(ref.location.path(MANIFEST), exc, f"{name!r}: bad dtype") from exc


def _average(name: str, dtype: torch.dtype, shards: list[Shards], raw: list[float]) -> torch.Tensor:
    """The weighted mean of one stored tensor: accumulated wide, written in ``dtype``."""
    wide = torch.complex128 if dtype.is_complex else torch.float64
    acc: torch.Tensor | None = None
    for reader, w in zip(shards, raw, strict=True):
        if w == 0.0:
            continue  # contributes nothing: not read
        term = reader.get(name).to(wide) * w
        acc = term if acc is None else acc.add_(term)
        del term
    if acc is None:  # unreachable: _raw_weights refuses an all-zero sum
        raise InvalidArgumentError("every weight is 0")
    return acc.div_(sum(raw)).to(dtype)


def average_checkpoints(
    paths: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    weights: Sequence[float] | None = None,
    key: str | None = None,
    out_step: int | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> CheckpointInfo:
    """Average the checkpoints ``paths`` and save the result as one step of the run ``out``.

    Each path is a step directory or a run directory (its newest step). ``weights`` (one per
    path, finite, >= 0, not all 0; normalized) default to a uniform mean. ``key`` averages
    only that top-level entry (e.g. ``"model"``), and the output holds just it. Floating
    tensors are averaged in float64 and written in their own dtype; integer and bool tensors
    and all other values come from the newest input (highest step; ties: the last path).
    Tied and viewed tensors stay tied in the output. The output step is ``out_step`` (default:
    the newest input's). ``progress(done, total)`` is called with counts of stored tensors.

    Args:
        paths: Step directories or run directories (their newest step), two or more.
        out: The run directory the average is saved into.
        weights: One weight per path (finite, >= 0, not all 0; normalized); default uniform.
        key: Average only this top-level entry; the output holds just it.
        out_step: The output's step; default the newest input's.
        overwrite: Replace the output step if it is committed.
        progress: ``progress(done, total)`` with counts of stored tensors.

    Returns:
        The :class:`CheckpointInfo` of the step written.

    Raises:
        KeyMismatchError: The inputs differ in names, shapes, dtypes or tying (all listed).
        InvalidArgumentError: Bad weights (count, sign, all zero).
        CorruptCheckpointError: A damaged input.
        StepNotFoundError: An input does not exist or has no committed step.
        StepExistsError: The output step is committed and ``overwrite`` is False.
        OutputExistsError: ``out`` is an existing file.
    """
    if isinstance(paths, str | bytes | os.PathLike) or not isinstance(paths, Sequence):
        raise InvalidArgumentError("paths must be a list of checkpoint directories")
    if key is not None and (not isinstance(key, str) or not key):
        raise InvalidArgumentError(f"key must be a non-empty str naming a state entry, got {key!r}")
    if not paths:
        raise InvalidArgumentError("average at least one checkpoint; no paths were given")
    require_bool("overwrite", overwrite)
    require_callable("progress", progress, "progress(done, total)")
    if isinstance(out, str | os.PathLike) and os.path.isfile(out):  # before any input is read
        raise OutputExistsError(
            f"{os.fspath(out)}: a file is in the way; out is the run directory the averaged "
            "step is saved in: pass another out",
            os.fspath(out),
        )
    raw = [1.0] * len(paths) if weights is None else _raw_weights(weights, len(paths))
    if out_step is not None:
        require_step(out_step, "out_step")
    state, chosen = _averaged_state(paths, raw, key, progress)
    # the inputs' manifests are released: the save's peak memory is the result's alone
    # a new set of tensors: nothing of an earlier step to reuse, no marks worth keeping
    return save(
        out, state, step=chosen if out_step is None else out_step, overwrite=overwrite,
        incremental=Incremental.WRITE_ALL,
    )  # fmt: skip


def _averaged_state(
    paths: Sequence[str | os.PathLike[str]],
    raw: list[float],
    key: str | None,
    progress: Progress | None,
) -> tuple[dict[str, object], int]:
    """The averaged state and the newest input's step."""
    inputs, newest = plan_inputs(paths, key)
    if not any(inp.found for inp in inputs):
        held = ", ".join(map(str, inputs[-1].manifest.state)) or "nothing"
        raise InvalidArgumentError(f"no checkpoint holds the entry {key!r} (entries: {held})")
    ref = inputs[newest]
    problems = mismatches(inputs, ref, key)
    if problems:
        raise KeyMismatchError(problems, _HINT)
    stored = sorted(
        (n for n, sig in ref.sigs.items() if sig.alias is None),
        key=lambda n: (file_of(ref.manifest, n), n),
    )
    if progress is not None:
        progress(0, len(stored))
    averaged: dict[str, torch.Tensor] = {}
    shards = [Shards(inp.location, inp.manifest) for inp in inputs]
    dtypes: dict[str, torch.dtype] = {}
    try:
        for done, name in enumerate(stored, 1):
            sig = ref.sigs[name]
            dtype = dtypes.get(sig.dtype) or dtypes.setdefault(
                sig.dtype, _dtype(ref, name, sig.dtype)
            )
            shape = sig.shape
            if math.prod(shape) == 0:  # no element to average or copy: nothing is read
                averaged[name] = torch.empty(shape, dtype=dtype)
            elif dtype.is_floating_point or dtype.is_complex:
                averaged[name] = _average(name, dtype, shards, raw)
            else:  # integer and bool tensors (counters, masks) come from the newest input
                averaged[name] = shards[newest].get(name)
            if progress is not None:
                progress(done, len(stored))
    finally:
        for reader in shards:
            reader.close()
    for name, sig in ref.sigs.items():
        if sig.alias is not None:
            base = averaged[sig.alias.base]
            averaged[name] = alias_tensor(ref.location, name, sig.alias, base)
    try:
        state = unflatten(ref.skeleton, averaged.__getitem__, key or "")
    except FormatError as exc:
        raise corrupt(ref.location.path(MANIFEST), exc, "state is malformed: {}") from exc
    return (state if key is None else {key: state}), ref.manifest.step
