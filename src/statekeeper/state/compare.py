"""Whether two values are the same: the one comparison statekeeper, ``testing`` and the
doctor use (the suite's own ``tests/conftest.py`` still has a bitwise one of its own).

How values compare is a :class:`Criterion`: a :class:`Match` mode and, for ``ALLCLOSE``,
tolerances.

- ``Match.BITWISE`` (:data:`BITWISE`, the default): tensors and numpy arrays are equal when
  their dtypes, shapes and bytes are. ``-0.0`` differs from ``0.0``; a NaN equals a NaN with
  the same bits only. Python and numpy float and complex scalars are equal when they are
  equal numbers with the same sign of zero, and any NaN equals any NaN (a checkpoint stores
  a scalar NaN as ``"nan"``, without its sign or payload).
- ``Match.ALLCLOSE``: floating and complex values (tensors, arrays, scalars) are equal when
  ``|a - b| <= atol + rtol * |b|`` everywhere, as ``torch.allclose(..., equal_nan=True)``
  has it: ``-0.0`` equals ``0.0``, NaN equals NaN, an infinity only itself. Integers and
  booleans compare exactly, whatever the tolerances. :data:`NUMERIC` is ``ALLCLOSE`` with
  no tolerance: equal as numbers.

In both modes tensors and arrays must have the same dtype and shape, other values the same
type (``1`` is not ``1.0``); the device a tensor sits on is not part of its value. Values
that are neither tensors, arrays nor numbers compare with ``==`` (by identity where ``==``
gives no plain bool).

:func:`same` compares two leaves; :func:`state_difference` two nested states (mappings,
lists, tuples), naming the key path of the first difference; :func:`leaves` flattens any
value into ``(path, leaf)`` pairs: tensors (detached copies), numbers, strings. Containers
are walked (mappings, lists, tuples, sets in sorted order), dataclasses by field, and other
objects by their attributes (``__dict__`` and ``__slots__``), so that two cache objects
holding equal tensors compare equal although they are different objects. Cycles and objects
seen twice are walked once; modules, functions, classes and generators are leaves compared
by identity-free descriptions. :func:`first_difference` compares two such lists.
"""

from __future__ import annotations

import cmath
import dataclasses
import math
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import torch

from statekeeper.errors import InvalidArgumentError

__all__ = [
    "BITWISE",
    "NUMERIC",
    "Criterion",
    "Leaves",
    "Match",
    "first_difference",
    "leaves",
    "same",
    "state_difference",
]


class Match(StrEnum):
    """How two values compare (see the module docstring)."""

    BITWISE = "bitwise"  # same bytes: -0.0 != 0.0, NaN == NaN of the same bits
    ALLCLOSE = "allclose"  # numerically close: -0.0 == 0.0, NaN == NaN


@dataclass(frozen=True)
class Criterion:
    """A :class:`Match` mode with its tolerances (finite, >= 0; ``ALLCLOSE`` only)."""

    match: Match = Match.BITWISE
    rtol: float = 0.0
    atol: float = 0.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "match", Match(self.match))
        except ValueError:
            raise InvalidArgumentError(
                f"match={self.match!r}: expected one of {', '.join(m.value for m in Match)}"
            ) from None
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgumentError(f"{name}={value!r}: a tolerance must be a number")
            if not (math.isfinite(value) and value >= 0):
                raise InvalidArgumentError(f"{name}={value!r}: a tolerance must be finite and >= 0")
            object.__setattr__(self, name, float(value))
        if self.match is Match.BITWISE and (self.rtol or self.atol):
            raise InvalidArgumentError(
                f"rtol={self.rtol}, atol={self.atol}: tolerances apply to Match.ALLCLOSE only; "
                "use Criterion(Match.ALLCLOSE, rtol=..., atol=...)"
            )


BITWISE = Criterion()
"""Same dtype, shape and bytes (the default)."""
NUMERIC = Criterion(Match.ALLCLOSE)
"""Equal as numbers: ``-0.0`` equals ``0.0``, NaN equals NaN."""


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s elements in order, as a flat uint8 tensor on its device."""
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    return t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def _tensors_same(a: torch.Tensor, b: torch.Tensor, how: Criterion) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.device != b.device:
        a, b = a.cpu(), b.cpu()
    if how.match is Match.BITWISE or not (a.is_floating_point() or a.is_complex()):
        return bool(torch.equal(_bytes(a), _bytes(b)))
    a, b = a.detach(), b.detach()
    try:
        return bool(torch.allclose(a, b, rtol=how.rtol, atol=how.atol, equal_nan=True))
    except (RuntimeError, NotImplementedError):  # a dtype allclose lacks (float8): widened
        wide = torch.complex128 if a.is_complex() else torch.float64
        return bool(
            torch.allclose(a.to(wide), b.to(wide), rtol=how.rtol, atol=how.atol, equal_nan=True)
        )


def _arrays_same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], how: Criterion) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.hasobject:
        return all(same(x, y, how) for x, y in zip(a.flat, b.flat, strict=True))
    if how.match is Match.BITWISE or a.dtype.kind not in "fc":
        return a.tobytes() == b.tobytes()
    return bool(np.allclose(a, b, rtol=how.rtol, atol=how.atol, equal_nan=True))


def _numbers_same(a: complex, b: complex, how: Criterion) -> bool:
    """Two float or complex scalars (see the module docstring)."""
    if how.match is Match.BITWISE:
        return all(
            (math.isnan(x) and math.isnan(y))
            or (x == y and math.copysign(1.0, x) == math.copysign(1.0, y))
            for x, y in ((a.real, b.real), (a.imag, b.imag))
        )
    if cmath.isnan(a) or cmath.isnan(b):
        return cmath.isnan(a) and cmath.isnan(b)
    return a == b or abs(a - b) <= how.atol + how.rtol * abs(b)


def same(a: Any, b: Any, how: Criterion = BITWISE) -> bool:
    """Whether two leaves (tensors, arrays, numbers, other plain values) are the same under
    ``how`` (see the module docstring)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        return both and _tensors_same(a, b, how)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        both = isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
        return both and _arrays_same(a, b, how)
    if type(a) is not type(b):
        return False
    if isinstance(a, np.floating | np.complexfloating):
        a, b = a.item(), b.item()
    if isinstance(a, float | complex):
        return _numbers_same(complex(a), complex(b), how)
    try:
        return bool(a == b)
    except Exception:  # comparisons that do not reduce to a bool
        return a is b


_MAX_DEPTH = 32
_OPAQUE = (
    types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
    torch.nn.Module, torch.dtype, torch.device,
)  # fmt: skip


def _attributes(obj: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                found[slot] = getattr(obj, slot)
    found.update(getattr(obj, "__dict__", {}))
    return {k: v for k, v in found.items() if not k.startswith("__")}


def leaves(value: Any, path: str = "output") -> Iterator[tuple[str, Any]]:
    """Every leaf of ``value`` with its path; tensors are detached copies."""
    seen: set[int] = set()

    def walk(obj: Any, where: str, depth: int) -> Iterator[tuple[str, Any]]:
        if isinstance(obj, torch.Tensor):
            yield where, obj.detach().clone()
            return
        if obj is None or isinstance(obj, bool | int | float | complex | str | bytes | np.generic):
            yield where, obj
            return
        if isinstance(obj, np.ndarray):
            yield where, np.array(obj)
            return
        if isinstance(obj, torch.Generator):
            yield where, obj.get_state()
            return
        if isinstance(obj, _OPAQUE) or depth >= _MAX_DEPTH:
            yield where, f"<{type(obj).__qualname__}>"
            return
        if id(obj) in seen:
            yield where, "<seen>"
            return
        seen.add(id(obj))
        if isinstance(obj, Mapping):
            children: list[tuple[str, Any]] = [(f"{where}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, list | tuple):
            children = [(f"{where}[{i}]", v) for i, v in enumerate(obj)]
        elif isinstance(obj, set | frozenset):
            children = [(f"{where}{{}}", v) for v in sorted(obj, key=repr)]
        elif dataclasses.is_dataclass(obj):
            children = [
                (f"{where}.{f.name}", getattr(obj, f.name)) for f in dataclasses.fields(obj)
            ]
        else:
            children = [(f"{where}.{k}", v) for k, v in _attributes(obj).items()]
        yield where, f"<{type(obj).__qualname__} of {len(children)}>"
        for child_path, child in children:
            yield from walk(child, child_path, depth + 1)

    yield from walk(value, path, 0)


Leaves = list[tuple[str, Any]]


def first_difference(
    left: Leaves, right: Leaves, how: Criterion = BITWISE
) -> tuple[str, Any, Any] | None:
    """The first leaf at which two :func:`leaves` lists differ: ``(path, leaf_a, leaf_b)``."""
    for (where, va), (other, vb) in zip(left, right, strict=False):
        if where != other or not same(va, vb, how):
            return where, va, vb
    if len(left) != len(right):
        longer = left if len(left) > len(right) else right
        return longer[min(len(left), len(right))][0], None, None
    return None


def state_difference(a: Any, b: Any, path: str = "", how: Criterion = BITWISE) -> str | None:
    """The key path of the first difference between two nested states, with what differs
    there, or None. Mappings compare by key (in any order), lists and tuples by position."""
    where = path or "<root>"
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        return None if same(a, b, how) else f"{where}: tensor values differ"
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return None if same(a, b, how) else f"{where}: array values differ"
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, Mapping):
        if list(a) != list(b) and set(a) != set(b):
            return f"{where}: keys differ ({sorted(map(str, set(a) ^ set(b)))[:5]})"
        for key in a:
            found = state_difference(a[key], b[key], f"{path}/{key}" if path else str(key), how)
            if found:
                return found
        return None
    if isinstance(a, list | tuple):
        if len(a) != len(b):
            return f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = state_difference(x, y, f"{path}/{i}" if path else str(i), how)
            if found:
                return found
        return None
    return None if same(a, b, how) else f"{where}: {a!r} vs {b!r}"
