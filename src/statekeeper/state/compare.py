"""Comparing values wherever their tensors sit: nested containers, dataclasses, model
outputs (``transformers``' ``ModelOutput``), cache objects and other plain objects.

:func:`leaves` flattens any value into ``(path, leaf)`` pairs: tensors (detached copies),
numbers, strings. Containers are walked (mappings, lists, tuples, sets in sorted order),
dataclasses by field, and other objects by their attributes (``__dict__`` and
``__slots__``), so that two cache objects holding equal tensors compare equal although they
are different objects. Cycles and objects seen twice are walked once; modules, functions,
classes and generators are leaves compared by identity-free descriptions.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["Leaves", "first_difference", "leaves", "same", "state_difference"]

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
        if obj is None or isinstance(obj, bool | int | float | complex | str | bytes):
            yield where, obj
            return
        if isinstance(obj, np.ndarray | np.generic):
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


def same(a: Any, b: Any) -> bool:
    """Bitwise equality of two leaves (nan equals nan, -0.0 differs from 0.0 in tensors)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # comparisons that do not reduce to a bool
        return a is b


Leaves = list[tuple[str, Any]]


def first_difference(left: Leaves, right: Leaves) -> tuple[str, Any, Any] | None:
    """The first leaf at which two :func:`leaves` lists differ: ``(path, leaf_a, leaf_b)``."""
    for (where, va), (other, vb) in zip(left, right, strict=False):
        if where != other or not same(va, vb):
            return where, va, vb
    if len(left) != len(right):
        longer = left if len(left) > len(right) else right
        return longer[min(len(left), len(right))][0], None, None
    return None


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def state_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The key path of the first difference between two states (bitwise for tensors), or None."""
    where = path or "<root>"
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        return None if torch.equal(_raw(a), _raw(b)) else f"{where}: tensor values differ"
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        same = a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
        return None if same else f"{where}: array values differ"
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, Mapping):
        if list(a) != list(b) and set(a) != set(b):
            return f"{where}: keys differ ({sorted(map(str, set(a) ^ set(b)))[:5]})"
        for key in a:
            found = state_difference(a[key], b[key], f"{path}/{key}" if path else str(key))
            if found:
                return found
        return None
    if isinstance(a, list | tuple):
        if len(a) != len(b):
            return f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = state_difference(x, y, f"{path}/{i}" if path else str(i))
            if found:
                return found
        return None
    if isinstance(a, float) and a != a and b != b:
        return None
    return None if a == b else f"{where}: {a!r} vs {b!r}"
