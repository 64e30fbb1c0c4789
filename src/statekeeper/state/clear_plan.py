"""Planning a ``clear_state`` call: which attributes and buffers of a module are cleared,
and which of their tensors are emptied in place (the rules are in
:mod:`statekeeper.state.clearing`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from statekeeper.errors import InvalidArgumentError
from statekeeper.state.attributes import INTERNALS, held_tensors
from statekeeper.state.clear_options import ClearAction, ClearMode
from statekeeper.state.clear_owner import Guard, emptiable, is_machinery
from statekeeper.state.clear_reset import changed_since_init, fresh_value, is_batch_state

__all__ = ["DECLARATIONS", "Step", "attribute_steps", "buffer_steps", "declared", "nbytes"]

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
    params: frozenset[int] | None = None  # the module's own parameters, found when needed
    steps = []
    for attr, value in vars(sub).items():
        tensors = None if attr in INTERNALS else held_tensors(value)
        if not tensors or not _pure(value) or any(is_machinery(t, guard) for t in tensors):
            continue  # no tensors, other values too, or machinery (LSTM, DDP, tied views)
        fresh = fresh_value(fresh_sub, attr)
        if not (
            attr in transient | owned | borrowed
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
        steps.append(Step(sub, attr, path, value, tensors, empty, fresh, action))
    return steps


def buffer_steps(path: str, sub: torch.nn.Module, fresh_sub: torch.nn.Module | None) -> list[Step]:
    """The steps resetting ``sub``'s per-batch buffers."""
    batch = declared(sub, "statekeeper_batch_state")
    for name in batch & set(sub._parameters):
        raise InvalidArgumentError(
            f"{type(sub).__qualname__}.statekeeper_batch_state names parameter '{name}': "
            "only buffers hold per-batch state, parameters are never cleared"
        )
    steps = []
    for name, buf in sub._buffers.items():
        if buf is None:
            continue
        persistent = name not in sub._non_persistent_buffers_set
        fresh = None if fresh_sub is None else fresh_sub._buffers.get(name)
        if is_batch_state(name, buf, batch, persistent, fresh):
            steps.append(Step(sub, name, path, buf, [buf], [], fresh, ClearAction.RESET))
    return steps
