"""Planning a ``clear_state`` call: which attributes and buffers of a module are cleared,
and which of their tensors are emptied in place (the rules are in
:mod:`statekeeper.clearing.clear`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from statekeeper.clearing.options import ClearAction, ClearMode
from statekeeper.clearing.owner import Guard, emptiable, is_machinery
from statekeeper.clearing.reset import (
    NO_FRESH,
    changed_since_init,
    derived,
    fresh_value,
    is_batch_state,
)
from statekeeper.errors import InvalidArgumentError
from statekeeper.state.attributes import INTERNALS, held_tensors

__all__ = [
    "DECLARATIONS",
    "Step",
    "attribute_steps",
    "buffer_steps",
    "check_declarations",
    "floating_dtype",
    "declared",
    "nbytes",
]

_RELEASED = ClearAction.RELEASED

DECLARATIONS = (
    "statekeeper_transient",
    "statekeeper_owned",
    "statekeeper_borrowed",
    "statekeeper_batch_state",
)


@dataclass
class Step:
    module: torch.nn.Module
    name: str  # the attribute or buffer
    path: str
    value: Any
    tensors: list[torch.Tensor]
    empty: list[torch.Tensor]
    fresh: Any
    action: ClearAction
    fresh_dtype: torch.dtype | None = None  # the fresh module's floating parameter dtype


def declared(module: torch.nn.Module, declaration: str) -> set[str]:
    names = getattr(type(module), declaration, ())
    if isinstance(names, str):
        names = (names,)
    if not isinstance(names, tuple | list | set | frozenset) or not all(
        isinstance(n, str) for n in names
    ):
        raise InvalidArgumentError(
            f"{type(module).__qualname__}.{declaration} must be a tuple of attribute names, "
            f"got {names!r}"
        )
    return set(names)


def check_declarations(module: torch.nn.Module) -> None:
    """Every declaration of ``module``'s class is a tuple of names, each where it belongs:
    plain attributes or non-persistent buffers (caches) in ``statekeeper_transient``,
    ``statekeeper_owned`` and ``statekeeper_borrowed``; buffers in
    ``statekeeper_batch_state`` (a name that is a plain attribute there, as in a subclass
    that keeps the state unregistered, is cleared as transient); never a parameter."""
    persistent = set(module._buffers) - module._non_persistent_buffers_set
    for declaration in DECLARATIONS:
        names = declared(module, declaration)
        wrong: dict[str, str] = {n: "parameter" for n in names & set(module._parameters)}
        if declaration != "statekeeper_batch_state":
            wrong |= {n: "persistent buffer" for n in names & persistent}
        for name, kind in sorted(wrong.items()):
            fix = {
                "parameter": "remove it: parameters are never cleared",
                "persistent buffer": "a saved buffer holding per-batch state goes in "
                "statekeeper_batch_state (cleared with include=ClearInclude.BATCH_STATE)",
            }[kind]
            raise InvalidArgumentError(
                f"{type(module).__qualname__}.{declaration} names {kind} '{name}': {fix}"
            )


def floating_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype of the module's first floating parameter, else buffer (its own and its
    children's): the dtype a cast of the whole module gave it."""
    for t in (*module.parameters(), *module.buffers()):
        if t.is_floating_point():
            return t.dtype
    return None


def _as_fresh(value: Any, fresh: Any) -> bool:
    """A plain value equal to what ``__init__`` left (``None``, the same number)."""
    if value is fresh:
        return True
    if held_tensors(value) is not None or type(value) is not type(fresh):
        return False
    try:
        return bool(value == fresh)
    except Exception:  # an object whose == does not answer
        return False


def _pure(value: Any) -> bool:
    """A tensor, or a list, tuple or dict of tensors and ``None`` only."""
    if isinstance(value, torch.Tensor):
        return True
    items = value.values() if isinstance(value, dict) else value
    return all(v is None or isinstance(v, torch.Tensor) for v in items)


def nbytes(t: torch.Tensor, seen: set[int]) -> int:
    if id(t) in seen or t.device.type == "meta":
        return 0
    seen.add(id(t))
    try:
        return t.numel() * t.element_size()
    except (RuntimeError, NotImplementedError):  # exotic subclasses
        return 0


def attribute_steps(
    path: str,
    sub: torch.nn.Module,
    fresh_sub: torch.nn.Module | None,
    mode: ClearMode,
    guard: Guard,
) -> list[Step]:
    """The steps clearing ``sub``'s transient attributes."""
    transient, owned, borrowed = (declared(sub, d) for d in DECLARATIONS[:3])
    transient |= declared(sub, "statekeeper_batch_state") - set(sub._buffers)
    params: frozenset[int] | None = None  # the module's own parameters, found when needed
    dtype = None if fresh_sub is None else floating_dtype(fresh_sub)
    steps = []
    caches = {n: b for n, b in sub._buffers.items() if n in transient | owned | borrowed}
    for attr, value in [*vars(sub).items(), *caches.items()]:
        tensors = None if attr in INTERNALS else held_tensors(value)
        fresh = fresh_value(fresh_sub, attr)
        named = attr in transient | owned | borrowed
        if named and fresh_sub is not None and not (tensors and _pure(value)):
            if not _as_fresh(value, fresh) and not any(
                is_machinery(t, guard) for t in tensors or ()
            ):  # a position counter, a cache object: back to what __init__ left
                steps.append(
                    Step(sub, attr, path, value, tensors or [], [], fresh, _RELEASED, dtype)
                )
            continue
        cache = attr in caches  # a declared non-persistent buffer: the module's cache
        if not tensors or not _pure(value):
            continue  # no tensors, or other values too
        if not cache and any(is_machinery(t, guard) for t in tensors):
            continue  # machinery (nn.LSTM's _flat_weights, DDP's lists, tied views)
        if not named and derived(fresh):
            continue  # computed from parameters by __init__ (tied, weight norm): machinery
        if not (
            named
            or any(t.grad_fn is not None for t in tensors)
            or (fresh_sub is not None and changed_since_init(value, tensors, fresh))
        ):
            continue  # a constant of __init__, or a value the forward did not make
        empty = []
        if mode is ClearMode.EMPTY and attr not in borrowed:
            if params is None:
                params = frozenset(id(p) for p in sub.parameters())
            empty = [t for t in tensors if emptiable(t, attr in owned, params, guard)]
        action = ClearAction.EMPTIED if empty else ClearAction.RELEASED
        steps.append(Step(sub, attr, path, value, tensors, empty, fresh, action, dtype))
    return steps


def buffer_steps(path: str, sub: torch.nn.Module, fresh_sub: torch.nn.Module | None) -> list[Step]:
    """The steps resetting ``sub``'s per-batch buffers."""
    batch = declared(sub, "statekeeper_batch_state")
    steps = []
    for name, buf in sub._buffers.items():
        if buf is None:
            continue
        persistent = name not in sub._non_persistent_buffers_set
        fresh = NO_FRESH if fresh_sub is None else fresh_sub._buffers.get(name)
        if is_batch_state(name, buf, batch, persistent, fresh):
            steps.append(Step(sub, name, path, buf, [buf], [], fresh, ClearAction.RESET))
    return steps
