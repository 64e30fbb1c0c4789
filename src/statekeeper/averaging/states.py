"""Averaging states that are already read: foreign checkpoints (``torch.save`` files,
safetensors files and Hugging Face folders), one input at a time.

:func:`~statekeeper.averaging.offline.average_checkpoints` streams statekeeper steps tensor by
tensor from their shards. Foreign files have no manifest to plan from, so here each input is
read whole (by the caller), compared with the first by tensor name, shape and dtype, folded
into float64 accumulators and dropped: memory is one input plus the accumulators. As there,
integer and bool tensors and every other value come from the last input, and tensors that
one object held under two names (tied weights) stay one tensor in the result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from statekeeper.errors import InvalidArgumentError, KeyMismatchError
from statekeeper.progress import Progress
from statekeeper.state.tree import Flat, flatten, unflatten

__all__ = ["average_states"]

_HINT = (
    "Average only checkpoints of one model (same tensor names, shapes and dtypes), or pick one "
    "entry that matches (key=...)."
)
Signature = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def _signature(flat: Flat) -> Signature:
    return {name: (t.dtype, tuple(t.shape)) for name, t in flat.tensors.items()}


def _mismatches(ref: Signature, sig: Signature, first: str, where: str) -> list[str]:
    problems = []
    for name in sorted(ref.keys() | sig.keys()):
        a, b = ref.get(name), sig.get(name)
        if a is None:
            problems.append(f"{name}: in {where} but not in {first}")
        elif b is None:
            problems.append(f"{name}: in {first} but missing from {where}")
        elif a != b:
            problems.append(
                f"{name}: {b[0]} {list(b[1])} in {where}, {a[0]} {list(a[1])} in {first}"
            )
    return problems


def _averaged(
    last: Flat, sums: dict[str, torch.Tensor], total: float
) -> Callable[[str], torch.Tensor]:
    """Tensor lookup for the result: means of the floating tensors, the last input's others,
    one result per tensor object of the last input (ties kept)."""
    by_object: dict[int, torch.Tensor] = {}

    def lookup(name: str) -> torch.Tensor:
        source = last.tensors[name]
        done = by_object.get(id(source))
        if done is None:
            acc = sums.get(name)
            done = source if acc is None else acc.div(total).to(source.dtype)
            by_object[id(source)] = done
        return done

    return lookup


def average_states(
    states: Iterable[tuple[str, Mapping[str, Any]]],
    weights: list[float],
    *,
    key: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The weighted mean of ``states`` (``(where, state)`` pairs, consumed one at a time, one
    weight each, already validated). ``KeyMismatchError`` lists every differing tensor."""
    sums: dict[str, torch.Tensor] = {}
    ref: Signature | None = None
    first = ""
    last: Flat | None = None
    for count, ((where, state), weight) in enumerate(zip(states, weights, strict=True), 1):
        if key is not None:
            if key not in state:
                held = ", ".join(map(str, state)) or "nothing"
                raise InvalidArgumentError(f"{where} holds no entry {key!r} (it holds: {held})")
            state = {key: state[key]}
        flat = flatten(dict(state))
        sig = _signature(flat)
        if ref is None:
            ref, first = sig, where
        else:
            problems = [] if sig == ref else _mismatches(ref, sig, first, where)
            if problems:
                raise KeyMismatchError(problems, _HINT)
        for name, tensor in flat.tensors.items():
            if tensor.numel() == 0:
                continue  # no element to average: the last input's (empty) tensor is the mean
            if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
                wide = torch.complex128 if tensor.dtype.is_complex else torch.float64
                term = tensor.to(wide) * weight
                sums[name] = term if name not in sums else sums[name].add_(term)
        last = flat if count == len(weights) else None
        del state, flat  # one input at a time: dropped before the next one is read
        if progress is not None:
            progress(count, len(weights))
    if last is None:
        raise InvalidArgumentError("average at least one checkpoint; none was given")
    result = unflatten(last.skeleton, _averaged(last, sums, sum(weights)))
    if not isinstance(result, dict):
        raise InvalidArgumentError("the averaged state is not a mapping")
    return result
