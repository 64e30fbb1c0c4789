"""Reusing the previous save's flatten and sharing plan when the state's structure repeats.

``prepare`` (flatten the captured state into a JSON skeleton and named tensors, then decide
which tensors share memory) is per-tensor Python work: about 38 ms for 3,304 tensors, which
an async save spends in the caller's stall (``bench/io.py``, async rows). Between two saves
of a training loop nothing it depends on changes. :class:`PlanCache` describes a captured
state by

- its *shape*: every container's type and keys (or length) and every non-tensor leaf's
  exact type and value, in traversal order (the order ``flatten`` visits them), and
- every tensor's dtype, shape, stride, storage offset, data pointer and device,

and when a new state's description equals a remembered one, reuses that plan's skeleton and
aliases and only puts the new tensor objects in (about 9 ms for the same state).

A state is planned entry by entry (its top-level names), each entry cached on its own, so
that an entry that changes at every save (the RNG states a ``Checkpointer`` adds, a step
counter) does not make the model's plan miss. The entries' plans compose into the plan of
the whole state (the same skeleton, names, order and aliases as ``flatten`` and
``plan_sharing`` of the whole) as long as no two entries share a storage; when two do, the
whole state is planned at once. The plan
is a function of exactly these: the skeleton of the shape, the tensor names of the key
paths, and the sharing plan of the storages (a storage's address is the tensor's data
pointer minus its offset) and the views' offsets, shapes and strides. No tensor is kept
alive by the cache. Whatever it cannot describe exactly (other value types, numpy arrays,
tensor subclasses, non-string keys, plans that copy a tensor or synthesise a storage base)
is never cached: ``prepare`` then runs in full, as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch

from statekeeper.format.aliases import Alias, plan_sharing
from statekeeper.format.values import Json
from statekeeper.state.tree import flatten

__all__ = ["Plan", "PlanCache"]

_ATOMS = frozenset({type(None), bool, int, str, torch.dtype, torch.device})
_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_TENSOR = object()  # a tensor leaf in a shape description
_ENTRIES = 16  # entry plans remembered: a few states of a few entries saved in turn all hit

TensorKey = tuple[torch.dtype, torch.Size, tuple[int, ...], int | torch.SymInt, int, torch.device]


@dataclass(frozen=True, eq=False)
class Plan:
    """A flattened, sharing-planned state without its tensors: ``stored`` names the tensors
    to write, by their position in traversal order. Compared by identity: the same object
    means the same names, dtypes and shapes in the same order."""

    skeleton: Json
    stored: tuple[tuple[str, int], ...]
    aliases: dict[str, Alias]


def _describe(value: Any, shape: list[object], tensors: list[torch.Tensor]) -> bool:
    """Append ``value``'s shape description and tensors; False if it cannot be described."""
    kind = type(value)
    if kind in _ATOMS:
        shape.append((kind, value))
    elif kind is float:
        shape.append((kind, value.hex()))  # tells -0.0 from 0.0; nan equals nan
    elif kind in _TENSOR_TYPES:
        shape.append(_TENSOR)
        tensors.append(value)
    elif kind is dict or kind is OrderedDict:
        keys = tuple(value)
        if not all(type(k) is str for k in keys):
            return False
        shape.append((kind, keys))
        for item in value.values():
            if not _describe(item, shape, tensors):
                return False
        if kind is OrderedDict:  # flatten encodes an OrderedDict's _metadata too
            return _describe(getattr(value, "_metadata", None), shape, tensors)
    elif kind is list or kind is tuple:
        shape.append((kind, len(value)))
        for item in value:
            if not _describe(item, shape, tensors):
                return False
    elif kind is torch.Size:
        shape.append((kind, tuple(value)))
    else:
        return False
    return True


def _keys(tensors: list[torch.Tensor]) -> list[TensorKey] | None:
    try:
        return [
            (t.dtype, t.shape, t.stride(), t.storage_offset(), t.data_ptr(), t.device)
            for t in tensors
        ]
    except RuntimeError:  # a tensor without storage (meta, some subclasses)
        return None


class PlanCache:
    """The last few plans, looked up by the description of a captured state."""

    def __init__(self) -> None:
        self._entries: list[tuple[list[object], list[TensorKey], Plan]] = []
        self._composites: list[tuple[tuple[Plan | None, ...], Plan]] = []
        self._mutex = threading.Lock()

    def plan(
        self, captured: dict[str, Any]
    ) -> tuple[Json, dict[str, torch.Tensor], dict[str, Alias], Plan | None]:
        """``captured``'s skeleton, tensors to store, aliases, and its Plan (None: uncached)."""
        if len(captured) < 2:
            one = self._plan_one(captured)
            return one.skeleton, one.stored, one.aliases, one.plan
        parts = [self._plan_one({name: value}) for name, value in captured.items()]
        bases: set[tuple[torch.device, int]] = set()
        for part in parts:
            mine = _storages(list(part.stored.values()))
            if mine is None or bases & mine:  # two entries share memory: plan the whole
                whole = _full(captured)
                return whole[0], whole[1], whole[2], None
            bases |= mine
        skeleton: dict[str, Json] = {}
        stored: dict[str, torch.Tensor] = {}
        aliases: dict[str, Alias] = {}
        for part in parts:
            skeleton.update(cast(dict[str, Json], part.skeleton))
            stored.update(part.stored)
            aliases.update(part.aliases)
        return skeleton, stored, aliases, self._composite(parts, skeleton, aliases)

    def _composite(
        self, parts: list[_Part], skeleton: dict[str, Json], aliases: dict[str, Alias]
    ) -> Plan | None:
        """One Plan for the entries' Plans (the same object for the same Plans), or None
        when an entry has none."""
        plans = tuple(part.plan for part in parts)
        if any(plan is None for plan in plans):
            return None
        with self._mutex:
            for known, composite in self._composites:
                if len(known) == len(plans) and all(
                    a is b for a, b in zip(known, plans, strict=True)
                ):
                    return composite
        stored: list[tuple[str, int]] = []
        offset = 0
        for part in parts:
            stored += [(name, offset + i) for name, i in part.plan.stored]  # type: ignore[union-attr]
            offset += part.visited
        composite = Plan(skeleton, tuple(stored), aliases)
        with self._mutex:
            self._composites = [(plans, composite), *self._composites][:_ENTRIES]
        return composite

    def _plan_one(self, captured: dict[str, Any]) -> _Part:
        shape: list[object] = []
        tensors: list[torch.Tensor] = []
        if not _describe(captured, shape, tensors):
            skeleton, stored, aliases, _ = _full(captured)
            return _Part(skeleton, stored, aliases, None, len(tensors))
        keys: list[TensorKey] | None = None
        with self._mutex:
            entries = list(self._entries)
        for entry_shape, entry_keys, plan in entries:
            if entry_shape == shape:
                keys = keys or _keys(tensors)
                if keys is not None and entry_keys == keys:
                    stored = {name: _detached(tensors[i]) for name, i in plan.stored}
                    return _Part(plan.skeleton, stored, plan.aliases, plan, len(tensors))
        skeleton, stored, aliases, order = _full(captured)
        keys = keys or _keys(tensors)
        if (
            keys is None
            or len(order) != len(tensors)
            or _keys(list(order.values())) != keys  # the same traversal order as flatten's
            or any(stored[n] is not order.get(n) for n in stored)  # nothing copied or made
        ):
            return _Part(skeleton, stored, aliases, None, len(tensors))
        position = {name: i for i, name in enumerate(order)}
        plan = Plan(skeleton, tuple((n, position[n]) for n in stored), aliases)
        with self._mutex:
            self._entries = [(shape, keys, plan), *self._entries][:_ENTRIES]
        return _Part(skeleton, stored, aliases, plan, len(tensors))


class _Part(NamedTuple):
    """The plan of one entry (or of a whole state), and how many tensors it visited."""

    skeleton: Json
    stored: dict[str, torch.Tensor]
    aliases: dict[str, Alias]
    plan: Plan | None
    visited: int


def _storages(tensors: list[torch.Tensor]) -> set[tuple[torch.device, int]] | None:
    """Where the memory of each of ``tensors`` begins (device, storage address); None when
    one of them has no storage to tell."""
    try:
        return {(t.device, t.untyped_storage().data_ptr()) for t in tensors if t.numel()}
    except RuntimeError:
        return None


def _detached(t: torch.Tensor) -> torch.Tensor:
    return t.detach() if t.requires_grad or type(t) is not torch.Tensor else t


def _full(
    captured: dict[str, Any],
) -> tuple[Json, dict[str, torch.Tensor], dict[str, Alias], dict[str, torch.Tensor]]:
    flat = flatten(captured)
    sharing = plan_sharing(flat.tensors)
    return flat.skeleton, sharing.stored, sharing.aliases, flat.tensors
