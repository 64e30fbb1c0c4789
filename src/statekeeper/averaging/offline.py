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
from dataclasses import dataclass

import torch

from statekeeper.arguments import require_bool, require_callable
from statekeeper.averaging.shards import Shards, file_of
from statekeeper.checkpoint.info import CheckpointInfo
from statekeeper.checkpoint.location import Location, locate, validate_step
from statekeeper.checkpoint.reader import alias_tensor, read_manifest
from statekeeper.checkpoint.save import save
from statekeeper.errors import CorruptCheckpointError, InvalidArgumentError, KeyMismatchError
from statekeeper.format.aliases import Alias
from statekeeper.format.dtypes import dtype_from_name
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.values import Json
from statekeeper.progress import Progress
from statekeeper.state.tree import unflatten

__all__ = ["average_checkpoints", "normalize_weights"]

_HINT = (
    "Average only checkpoints of one model (same tensor names, shapes, dtypes and tying), "
    "or pick one entry that matches with key=... (--key on the command line)."
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


@dataclass(frozen=True)
class _Sig:
    """What must agree across inputs for one tensor name."""

    dtype: str
    shape: tuple[int, ...]
    alias: Alias | None


@dataclass(frozen=True)
class _Input:
    location: Location
    manifest: Manifest
    found: bool  # whether the state holds the entry ``key`` (always True without a key)
    skeleton: Json  # the state, or the entry ``key`` of it
    sigs: dict[str, _Sig]  # every tensor in scope: referenced ones and the bases of aliases


_REF_TAGS = ("$tensor", "$ndarray")


def _references(skeleton: Json) -> list[str]:
    """The tensor names ``skeleton`` refers to: one walk over its containers, no value built
    (the newest input's skeleton is decoded, and checked, when the result is rebuilt)."""
    refs: list[str] = []
    stack = [skeleton]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            if len(item) == 1:
                ((tag, body),) = item.items()
                if tag in _REF_TAGS and type(body) is str:
                    refs.append(body)
                    continue
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
    return refs


def _signatures(manifest: Manifest, skeleton: Json, where: str) -> dict[str, _Sig]:
    refs = _references(skeleton)
    sigs: dict[str, _Sig] = {}
    for name in refs:
        sharded = manifest.sharding.tensors.get(name) if manifest.sharding else None
        if sharded is not None:  # a multi-process step: assembled from its chunks on read
            sigs[name] = _Sig(sharded.dtype, sharded.shape, None)
            continue
        alias = manifest.aliases.get(name)
        base = alias.base if alias is not None else name
        record = manifest.tensors.get(base)
        if record is None:
            raise CorruptCheckpointError(where, f"state refers to unknown tensor {name!r}")
        sigs[base] = _Sig(record.dtype, record.shape, None)
        if alias is not None:
            sigs[name] = _Sig(record.dtype, alias.shape, alias)
    return sigs


def _plan(paths: Sequence[str | os.PathLike[str]], key: str | None) -> list[_Input]:
    inputs: list[_Input] = []
    for path in paths:
        location = locate(path, None)
        manifest = read_manifest(location)
        where = location.path(MANIFEST)
        if location.step >= 0 and manifest.step != location.step:
            raise CorruptCheckpointError(
                where, f"manifest is for step {manifest.step}, not {location.step}"
            )
        if not isinstance(manifest.state, dict):
            raise CorruptCheckpointError(where, "state is not a mapping")
        found = key is None or key in manifest.state
        skeleton = manifest.state if key is None else manifest.state.get(key)
        sigs = _signatures(manifest, skeleton, where) if found else {}
        inputs.append(_Input(location, manifest, found, skeleton, sigs))
    return inputs


def _mismatches(inputs: list[_Input], ref: _Input, key: str | None) -> list[str]:
    problems: list[str] = []
    ref_path = ref.location.path()
    for inp in inputs:
        path = inp.location.path()
        if not inp.found:
            held = ", ".join(map(str, inp.manifest.state)) or "nothing"
            problems.append(f"{key}: no such entry in {path} (it holds: {held})")
            continue
        if inp is ref:
            continue
        for name in sorted(ref.sigs.keys() | inp.sigs.keys()):
            a, b = ref.sigs.get(name), inp.sigs.get(name)
            if a is None:
                problems.append(f"{name}: in {path} but not in {ref_path}")
            elif b is None:
                problems.append(f"{name}: in {ref_path} but missing from {path}")
            elif a.shape != b.shape:
                problems.append(f"{name}: shape {b.shape} in {path}, {a.shape} in {ref_path}")
            elif a.dtype != b.dtype:
                problems.append(f"{name}: dtype {b.dtype} in {path}, {a.dtype} in {ref_path}")
            elif a.alias != b.alias:
                problems.append(f"{name}: shares memory differently in {path} and {ref_path}")
    return problems


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
    step: int | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> CheckpointInfo:
    """Average the checkpoints ``paths`` and save the result as one step of the run ``out``.

    Each path is a step directory or a run directory (its newest step). ``weights`` (one per
    path, finite, >= 0, not all 0; normalized) default to a uniform mean. ``key`` averages
    only that top-level entry (e.g. ``"model"``), and the output holds just it. Floating
    tensors are averaged in float64 and written in their own dtype; integer and bool tensors
    and all other values come from the newest input (highest step; ties: the last path).
    Tied and viewed tensors stay tied in the output. The output step is ``step`` (default:
    the newest input's). ``progress(done, total)`` is called with counts of stored tensors.

    Raises ``KeyMismatchError`` listing every differing name, shape, dtype or tying,
    ``InvalidArgumentError`` for bad weights, ``CorruptCheckpointError`` for a damaged input
    and ``StepExistsError`` when the output step is already committed (unless ``overwrite``).
    """
    if isinstance(paths, str | bytes | os.PathLike) or not isinstance(paths, Sequence):
        raise InvalidArgumentError("paths must be a list of checkpoint directories")
    if key is not None and (not isinstance(key, str) or not key):
        raise InvalidArgumentError(f"key must be a non-empty str naming a state entry, got {key!r}")
    if not paths:
        raise InvalidArgumentError("average at least one checkpoint; no paths were given")
    require_bool("overwrite", overwrite)
    require_callable("progress", progress, "progress(done, total)")
    raw = [1.0] * len(paths) if weights is None else _raw_weights(weights, len(paths))
    if step is not None:
        validate_step(step)
    inputs = _plan(paths, key)
    if not any(inp.found for inp in inputs):
        held = ", ".join(map(str, inputs[-1].manifest.state)) or "nothing"
        raise InvalidArgumentError(f"no checkpoint holds the entry {key!r} (entries: {held})")
    newest = max(range(len(inputs)), key=lambda i: (inputs[i].manifest.step, i))
    ref = inputs[newest]
    problems = _mismatches(inputs, ref, key)
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
    try:
        for done, name in enumerate(stored, 1):
            try:
                dtype = dtype_from_name(ref.sigs[name].dtype)
            except ValueError:
                raise CorruptCheckpointError(
                    ref.location.path(MANIFEST), f"{name!r}: bad dtype"
                ) from None
            shape = ref.sigs[name].shape
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
    except ValueError as exc:
        where = ref.location.path(MANIFEST)
        raise CorruptCheckpointError(where, f"state is malformed: {exc}") from None
    result = state if key is None else {key: state}
    chosen = ref.manifest.step if step is None else step
    return save(out, result, step=chosen, overwrite=overwrite)
