"""Comparing two checkpoints of any readable formats, one tensor at a time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from statekeeper.arguments import require_callable
from statekeeper.errors import InvalidArgumentError
from statekeeper.format.aliases import view_key
from statekeeper.format.dtypes import dtype_name
from statekeeper.interop.tied import TiedKeys, drop_tied
from statekeeper.interop.tree import (
    WRAPPER_PREFIXES,
    as_tensor,
    flat_leaves,
    select,
    strip_prefixes,
)
from statekeeper.progress import Progress

__all__ = ["WRAPPER_PREFIXES", "Change", "DiffReport", "TensorDiff", "compare_states", "diff"]

_CHUNK = 1 << 22  # elements compared at a time (bounded float64 temporaries)


@dataclass(frozen=True)
class TensorDiff:
    """A tensor present in both, of the same shape: its largest differences.

    ``max_abs`` is ``max |a - b|``; ``max_rel`` is ``max |a - b| / |b|`` (``inf`` where b is
    0 and a is not). NaNs in the same places count as equal; elsewhere they make both ``nan``.
    """

    key: str
    shape: tuple[int, ...]
    dtype_a: str
    dtype_b: str
    max_abs: float
    max_rel: float
    equal: bool  # within atol/rtol (exactly equal when both are 0)


@dataclass(frozen=True)
class Change:
    """A key whose kind, shape or dtype differs, or a plain value that differs."""

    key: str
    what: str  # "shape", "dtype", "type" or "value"
    a: str
    b: str


@dataclass(frozen=True)
class DiffReport:
    """What ``diff`` found; ``equal`` is True when nothing differs.

    Attributes:
        a: The first input, as named in messages.
        b: The second input.
        only_a: Keys only ``a`` has.
        only_b: Keys only ``b`` has.
        changed: Keys whose kind, shape, dtype or plain value differ.
        different: Tensors of the same shape outside the tolerance, largest
            ``max_abs`` first.
        equal_tensors: The keys of the tensors found equal.
        equal_values: How many plain values were equal.
        atol: The absolute tolerance used.
        rtol: The relative tolerance used.
        notes: What the comparison did besides matching keys (a side compared whole, tied
            keys dropped, prefixes stripped).
    """

    a: str
    b: str
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    changed: tuple[Change, ...]
    different: tuple[TensorDiff, ...]  # outside tolerance, largest max_abs first
    equal_tensors: tuple[str, ...]
    equal_values: int
    atol: float
    rtol: float
    notes: tuple[str, ...] = field(default=())

    @property
    def equal(self) -> bool:
        return not (self.only_a or self.only_b or self.changed or self.different)

    def to_json(self) -> dict[str, Any]:
        """The result as JSON-able data, ``equal`` included (``statekeeper diff --json``).

        Returns:
            A dict of the fields and ``equal``.
        """
        data = asdict(self)
        data["equal"] = self.equal
        return data


def _view(t: torch.Tensor) -> tuple[Any, ...]:
    """What decides a tensor's elements: the view of memory it is (``view_key``) and the
    lazy conjugate and negative bits (views that share memory but not values)."""
    key = view_key(t)
    return (id(t) if key is None else key, t.is_conj(), t.is_neg())


def _unrepeated(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` without the dimensions along which both repeat one value (stride 0 in
    both: an ``expand``, or an alias that repeats its base): every difference appears in the
    first slice, so comparing it gives the same result for the cost of the stored data."""
    for dim in range(a.dim()):
        if a.shape[dim] > 1 and a.stride(dim) == 0 and b.stride(dim) == 0:
            a, b = a.narrow(dim, 0, 1), b.narrow(dim, 0, 1)
    return a, b


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` (same shape and dtype) hold equal values (as numbers: -0.0
    equals 0.0, as in the tolerance check; NaNs go to that check): one pass, and no float64
    copies, for the common case of equal tensors."""
    try:
        return bool(torch.equal(a, b))
    except (RuntimeError, TypeError, NotImplementedError):  # a dtype equal does not support
        return False


def _compare(
    key: str, a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float, same: bool = False
) -> TensorDiff:
    """``same``: ``a`` and ``b`` are known to be the same view of the same memory."""
    shape = tuple(a.shape)
    if a.dtype == b.dtype and (same or _identical(*_unrepeated(a, b))):
        return TensorDiff(key, shape, dtype_name(a.dtype), dtype_name(b.dtype), 0.0, 0.0, True)
    a, b = _unrepeated(a, b)
    fa, fb = a.reshape(-1), b.reshape(-1)
    wide = torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
    max_abs = max_rel = 0.0
    within = True
    for start in range(0, fa.numel(), _CHUNK):
        x = fa[start : start + _CHUNK].to(wide)
        y = fb[start : start + _CHUNK].to(wide)
        both_nan = torch.isnan(x) & torch.isnan(y)
        delta = torch.where(both_nan, 0, (x - y).abs()).real
        scale = y.abs().real
        delta = torch.where(torch.isnan(delta), math.inf, delta)  # a nan against a number
        rel = torch.where(delta == 0, 0, delta / scale)
        if delta.numel():
            max_abs = max(max_abs, float(delta.max()))
            max_rel = max(max_rel, float(rel.max()))
            tolerance = atol + rtol * torch.nan_to_num(scale, nan=0.0)
            within = within and bool(((delta <= tolerance) | both_nan).all())
    exact = atol == 0 and rtol == 0
    equal = within and (not exact or max_abs == 0)
    return TensorDiff(key, shape, dtype_name(a.dtype), dtype_name(b.dtype), max_abs, max_rel, equal)


def _same_value(x: Any, y: Any) -> bool:
    try:
        return bool(x == y) or (x != x and y != y)
    except (TypeError, ValueError, RuntimeError):
        return repr(x) == repr(y)


def compare_states(
    a: Any, b: Any, *, atol: float = 0.0, rtol: float = 0.0, names: tuple[str, str] = ("A", "B"),
    progress: Progress | None = None,
) -> DiffReport:  # fmt: skip
    """Compare two already-read states (nested or flat); see :func:`diff`."""
    if atol < 0 or rtol < 0 or not (math.isfinite(atol) and math.isfinite(rtol)):
        raise InvalidArgumentError(f"atol and rtol must be finite and >= 0, got {atol}, {rtol}")
    fa, fb = flat_leaves(a), flat_leaves(b)
    only_a = tuple(k for k in fa if k not in fb)
    only_b = tuple(k for k in fb if k not in fa)
    changed: list[Change] = []
    different: list[TensorDiff] = []
    equal_tensors: list[str] = []
    equal_values = 0
    common = [k for k in fa if k in fb]
    seen: dict[tuple[Any, ...], TensorDiff] = {}  # tied tensors (same views on both sides): once
    for n, key in enumerate(common):
        x, y = fa[key], fb[key]
        tx, ty = as_tensor(x), as_tensor(y)
        if (tx is None) != (ty is None):
            changed.append(Change(key, "type", type(x).__name__, type(y).__name__))
        elif tx is not None and ty is not None:
            if tx.shape != ty.shape:
                changed.append(Change(key, "shape", str(tuple(tx.shape)), str(tuple(ty.shape))))
                continue
            if tx.dtype != ty.dtype:
                changed.append(Change(key, "dtype", dtype_name(tx.dtype), dtype_name(ty.dtype)))
            # torch tensors live in the states all along, so their addresses name them (a
            # numpy array may be a temporary copy): tied entries are compared once
            held = isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
            pair = (_view(tx), _view(ty)) if held else None
            result = seen.get(pair) if pair is not None else None
            if result is None:
                same = pair is not None and pair[0] == pair[1]
                result = _compare(key, tx, ty, atol, rtol, same)
                if pair is not None:
                    seen[pair] = result
            result = replace(result, key=key) if result.key != key else result
            (equal_tensors.append(key) if result.equal else different.append(result))
        elif _same_value(x, y):
            equal_values += 1
        else:
            changed.append(Change(key, "value", repr(x)[:200], repr(y)[:200]))
        if progress is not None:
            progress(n + 1, len(common))
    different.sort(key=lambda d: (-_order(d.max_abs), -_order(d.max_rel), d.key))
    return DiffReport(
        names[0], names[1], only_a, only_b, tuple(changed), tuple(different),
        tuple(equal_tensors), equal_values, atol, rtol,
    )  # fmt: skip


def _order(x: float) -> float:
    return math.inf if math.isnan(x) else x


def diff(
    a: str | Path | Any,
    b: str | Path | Any,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    key: str | None = None,
    strip: Sequence[str] = (),
    tied: TiedKeys = TiedKeys.AUTO,
    progress: Progress | None = None,
) -> DiffReport:
    """Compare two checkpoints of any readable formats (paths, or states already read).

    Leaves are matched by their key path joined with ``.`` (``model.fc.weight``). ``key``
    compares the sub-tree ``key`` of each side that has it (a side without it is compared
    whole, so ``diff(run, "model.safetensors", key="model")`` works). ``strip`` removes
    prefixes from every key: pass :data:`WRAPPER_PREFIXES` (``module.``, ``_orig_mod.``)
    to ignore DDP and ``torch.compile`` wrappers. Tensors are equal when every element
    satisfies ``|a - b| <= atol + rtol * |b|`` (bitwise-equal values when both are 0).
    ``tied`` decides whether a key one side omits because it is tied to another counts as
    equal (:class:`~statekeeper.interop.tied.TiedKeys`; by default for Hugging Face folders
    and safetensors files, which store tied weights once).

    Args:
        a: A checkpoint path of any readable format, or a state already read.
        b: The other one, likewise.
        atol: Absolute tolerance per element.
        rtol: Relative tolerance per element (relative to ``b``).
        key: Compare only this sub-tree of each side that has it.
        strip: Key prefixes to remove on both sides before matching.
        tied: :class:`TiedKeys`: whether a key omitted because it is tied counts as equal.
        progress: ``progress(done, total)`` over the tensors compared.

    Returns:
        A :class:`DiffReport`: ``equal``, ``only_a``, ``only_b``, ``changed``, ``different``.

    Raises:
        InvalidArgumentError: Negative or non-finite tolerances, a ``tied`` that is no
            :class:`TiedKeys`, or a ``key`` neither side has.
        StepNotFoundError: A path that does not exist.
        CorruptCheckpointError: A damaged input.
        UnsafePickleError: A pickle-based input asks for more than tensors.
    """
    if not isinstance(tied, TiedKeys):
        raise InvalidArgumentError(f"tied must be a TiedKeys, got {tied!r}")
    require_callable("progress", progress, "progress(done, total)")
    from statekeeper.interop.reading import read

    states = []
    for side in (a, b):
        states.append(read(side) if isinstance(side, str | Path) else side)
    label = [str(s) if isinstance(s, str | Path) else n for s, n in ((a, "A"), (b, "B"))]
    notes: list[str] = []
    if key is not None:
        has = [isinstance(s, dict) and _has_key(s, key) for s in states]
        if not any(has):
            raise InvalidArgumentError(f"neither {label[0]} nor {label[1]} has an entry {key!r}")
        for i in range(2):
            if has[i]:
                states[i] = select(states[i], key, label[i])
            else:
                notes.append(f"{label[i]} has no entry {key!r}: compared whole")
    flats = [strip_prefixes(flat_leaves(s), tuple(strip)) for s in states]
    if tied is TiedKeys.MATCH or (tied is TiedKeys.AUTO and _stores_ties_once(a, b)):
        flats[0], flats[1], tie_notes = drop_tied(flats[0], flats[1], (label[0], label[1]))
        notes += tie_notes
    result = compare_states(flats[0], flats[1], atol=atol, rtol=rtol, names=(label[0], label[1]),
                            progress=progress)  # fmt: skip
    if strip:
        notes.append(f"stripped prefixes {', '.join(map(repr, strip))}")
    return replace(result, notes=tuple(notes))


def _stores_ties_once(*sides: Any) -> bool:
    """Whether a side is a path in a format that stores tied weights once."""
    from statekeeper.catalog.detect import Format, foreign_format

    for side in sides:
        found = foreign_format(side) if isinstance(side, str | Path) else None
        if found is not None and found[1] in (Format.HUGGINGFACE, Format.SAFETENSORS):
            return True
    return False


def _has_key(state: dict[str, Any], key: str) -> bool:
    try:
        select(state, key, "")
    except InvalidArgumentError:
        return False
    return True
