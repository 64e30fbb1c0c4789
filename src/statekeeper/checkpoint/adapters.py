"""The one table that says how each kind of state is captured, checked and restored.

A save looks up each entry's :class:`Adapter` (the first whose ``matches`` accepts it) and
calls ``capture``; a load calls ``check`` for every entry (pure: nothing is loaded), then,
once every check and checksum has passed, ``restore``. The local pipelines
(:mod:`.save`, :mod:`.load`) and the distributed one alike use this table: the distributed
path splits a state by each adapter's :class:`Kind`, writes modules and optimizers through
``torch.distributed.checkpoint`` and captures and restores every other entry here.

Order of lookup: adapters registered by higher layers (:func:`register`; e.g. torchdata's
``StatefulDataLoader`` by :mod:`statekeeper.data.adapters`, ``PerRank`` by
:mod:`statekeeper.distributed`), newest first, then the built-in ones, most specific first:
module, optimizer, RNG, any ``Stateful``, tensor, mutable mapping, list, and last the plain
value, which ``load`` assigns back into the caller's mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

from statekeeper import extensions
from statekeeper.checkpoint.checks import Strict, module_problems, tensor_problems
from statekeeper.checkpoint.direct import copy_pairs, direct_pairs
from statekeeper.checkpoint.overlap import replace_overlapping
from statekeeper.errors import InvalidArgumentError
from statekeeper.state.modules import unwrap
from statekeeper.state.optimizer import (
    OptimizerChange,
    parameter_names,
    to_named,
    to_positional,
)
from statekeeper.state.rng import RNGState
from statekeeper.stateful import is_stateful

__all__ = [
    "MODULE",
    "OPTIMIZER",
    "PLAIN",
    "RNG",
    "Adapter",
    "Capturing",
    "Kind",
    "Restoring",
    "adapter_for",
    "register",
]


class Kind(StrEnum):
    """What an entry is to a job of several processes (and to the order of a save/load).

    - ``MODULE``, ``OPTIMIZER``: sharded or replicated tensors that a distributed save
      writes through ``torch.distributed.checkpoint``;
    - ``RNG``: captured before any other entry, restored after every other; each rank's own;
    - ``PER_RANK``: each rank's own (data loaders, ``PerRank``);
    - ``REPLICATED``: the same on every rank; rank 0's is saved.
    """

    MODULE = "module"
    OPTIMIZER = "optimizer"
    RNG = "rng"
    PER_RANK = "per_rank"
    REPLICATED = "replicated"


class _ParameterNames:
    """The names of the parameters of the state's modules, computed once, on first use: an
    optimizer's state is keyed by them."""

    state: Mapping[str, Any]
    _names: dict[int, str] | None = None

    def parameter_names(self) -> Mapping[int, str]:
        if self._names is None:
            self._names = parameter_names(self.state)
        return self._names


class Capturing(_ParameterNames):
    """What a capture may need besides its own entry: the whole state."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.state = state


@dataclass
class Restoring(_ParameterNames):
    """A load's options, and what its adapters report back: the entries whose direct copy
    plan held at check time, the plain values to assign back, and live tensors that
    overlapped themselves and were given their own memory."""

    state: Mapping[str, Any]
    strict: Strict = Strict.EXACT
    on_optimizer_change: OptimizerChange = OptimizerChange.REFUSE
    direct: set[str] = field(default_factory=set)
    values: dict[str, Any] = field(default_factory=dict)
    replaced: list[str] = field(default_factory=list)
    _names: dict[int, str] | None = None


def _no_problems(name: str, obj: Any, saved: Any, ctx: Restoring) -> tuple[Any, list[str]]:
    return saved, []


def _no_generators(obj: Any) -> Iterable[object]:
    return ()


@dataclass(frozen=True)
class Adapter:
    """How one kind of state is captured, checked and restored.

    ``capture(name, obj, ctx)`` returns plain state (tensors, JSON-able values);
    ``check(name, obj, saved, ctx)`` returns the value to restore and every mismatch, and
    loads nothing; ``restore(name, obj, value, ctx)`` applies it (exceptions from it become
    ``LoadStateError`` naming the entry); ``generators(obj)`` are the RNGs the object saves
    itself (an ``RNGState`` may not hold them too).
    """

    name: str
    kind: Kind
    matches: Callable[[object], bool]
    capture: Callable[[str, Any, Capturing], Any]
    restore: Callable[[str, Any, Any, Restoring], None]
    check: Callable[[str, Any, Any, Restoring], tuple[Any, list[str]]] = _no_problems
    generators: Callable[[Any], Iterable[object]] = _no_generators

    @property
    def assigns_back(self) -> bool:
        """Whether a load assigns the saved value into the caller's mapping (a plain value,
        which cannot be restored in place) instead of restoring the object."""
        return self.restore is _restore_plain


# --- built-in adapters ------------------------------------------------------------------


def _capture_module(name: str, obj: Any, ctx: Capturing) -> Any:
    return unwrap(obj).state_dict()


def _check_module(name: str, obj: Any, saved: Any, ctx: Restoring) -> tuple[Any, list[str]]:
    inner = unwrap(obj)
    if isinstance(saved, Mapping) and direct_pairs(inner, saved) is not None:
        ctx.direct.add(name)  # the direct copy plan matched every key, shape and dtype
        return saved, []
    return saved, module_problems(name, inner, saved, ctx.strict)


def _restore_module(name: str, obj: Any, value: Any, ctx: Restoring) -> None:
    inner = unwrap(obj)
    ctx.replaced += replace_overlapping(name, inner, set(value))
    # planned before the checksums: planned again, with today's tensors (an earlier entry
    # may have replaced some)
    pairs = direct_pairs(inner, value) if name in ctx.direct else None
    if pairs is None:
        inner.load_state_dict(value, strict=ctx.strict is Strict.EXACT)
    else:
        copy_pairs(pairs)


def _capture_optimizer(name: str, obj: Any, ctx: Capturing) -> Any:
    try:
        return to_named(name, obj, ctx.parameter_names())
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


def _check_optimizer(name: str, obj: Any, saved: Any, ctx: Restoring) -> tuple[Any, list[str]]:
    return to_positional(name, saved, obj, ctx.parameter_names(), ctx.on_optimizer_change)


def _capture_stateful(name: str, obj: Any, ctx: Capturing) -> Any:
    return obj.state_dict()


def _restore_stateful(name: str, obj: Any, value: Any, ctx: Restoring) -> None:
    obj.load_state_dict(value)


def _check_rng(name: str, obj: Any, saved: Any, ctx: Restoring) -> tuple[Any, list[str]]:
    return saved, obj.mismatches(saved, name)


def _check_tensor(name: str, obj: Any, saved: Any, ctx: Restoring) -> tuple[Any, list[str]]:
    return saved, tensor_problems(name, saved, obj)


def _restore_tensor(name: str, obj: Any, value: Any, ctx: Restoring) -> None:
    with torch.no_grad():
        obj.copy_(value)


def _capture_value(name: str, obj: Any, ctx: Capturing) -> Any:
    return obj


def _restore_mapping(name: str, obj: Any, value: Any, ctx: Restoring) -> None:
    if not isinstance(value, Mapping):
        ctx.values[name] = value  # another kind of value was saved: assigned back
        return
    obj.clear()
    obj.update(value)


def _restore_list(name: str, obj: Any, value: Any, ctx: Restoring) -> None:
    if not isinstance(value, list):
        ctx.values[name] = value
        return
    obj[:] = value


def _restore_plain(name: str, obj: Any, value: Any, ctx: Restoring) -> None:
    ctx.values[name] = value


MODULE = Adapter(
    "module",
    Kind.MODULE,
    lambda obj: isinstance(obj, torch.nn.Module),
    _capture_module,
    _restore_module,
    _check_module,
)
OPTIMIZER = Adapter(
    "optimizer",
    Kind.OPTIMIZER,
    lambda obj: isinstance(obj, torch.optim.Optimizer),
    _capture_optimizer,
    _restore_stateful,
    _check_optimizer,
)
RNG = Adapter(
    "rng",
    Kind.RNG,
    lambda obj: isinstance(obj, RNGState),
    _capture_stateful,
    _restore_stateful,
    _check_rng,
)
STATEFUL = Adapter("stateful", Kind.REPLICATED, is_stateful, _capture_stateful, _restore_stateful)
TENSOR = Adapter(
    "tensor",
    Kind.REPLICATED,
    lambda obj: isinstance(obj, torch.Tensor),
    _capture_value,
    _restore_tensor,
    _check_tensor,
)
MAPPING = Adapter(
    "mapping",
    Kind.REPLICATED,
    lambda obj: isinstance(obj, MutableMapping),
    _capture_value,
    _restore_mapping,
)
LIST = Adapter(
    "list", Kind.REPLICATED, lambda obj: isinstance(obj, list), _capture_value, _restore_list
)
PLAIN = Adapter("plain", Kind.REPLICATED, lambda obj: True, _capture_value, _restore_plain)
"""A value that cannot be restored in place (an int, a str, a tuple...): ``load`` assigns
its saved value into the caller's mapping."""

_BUILT_IN = (MODULE, OPTIMIZER, RNG, STATEFUL, TENSOR, MAPPING, LIST, PLAIN)
_registered: list[Adapter] = []
_SCALARS = frozenset({int, float, str, bool, type(None)})


def register(adapter: Adapter) -> None:
    """Consult ``adapter`` before every adapter registered earlier and every built-in one.
    Registering an adapter of the same name again replaces it (a module imported twice)."""
    if not isinstance(adapter, Adapter):
        raise InvalidArgumentError(f"register takes an Adapter, got {adapter!r}")
    _registered[:] = [adapter, *(a for a in _registered if a.name != adapter.name)]


def adapter_for(obj: object) -> Adapter:
    """The adapter that captures and restores ``obj``."""
    extensions.install()
    for adapter in _registered:
        if adapter.matches(obj):
            return adapter
    kind = type(obj)
    if kind is torch.Tensor:  # no built-in before TENSOR matches a plain tensor (a state of
        return TENSOR  # 500,000 of them is captured once per save: bench/average_empty.py)
    if kind in _SCALARS:
        return PLAIN
    for adapter in _BUILT_IN:
        if adapter.matches(obj):
            return adapter
    return PLAIN  # pragma: no cover - PLAIN matches everything
