"""``clear_state(module)``: a model's transient tensors let go (Torch7's ``clearState``).

Transient tensors are what a module holds besides its parameters, buffers and submodules,
put there by its forward: cached outputs, the last hidden state of a recurrent or spiking
layer, attention caches, activations a hook keeps. ``state_dict()`` leaves them out, but
they hold memory (and often the autograd graph behind them), are pickled with the module,
and change what the next forward computes.

Which attributes are cleared, on each module:

- the attributes its class lists in ``statekeeper_transient`` (names), whatever they hold;
- any other attribute holding a tensor with autograd history (``grad_fn``): a product of a
  forward (a constant of ``__init__`` has none, and a view of a parameter, tied weights'
  ``self.wt = emb.weight.t()``, is left alone);
- a tensor is a plain attribute, or a list, tuple or dict of tensors only (one level deep,
  as the doctor's SK004 looks); a container that also holds other values is left alone,
  and so is any attribute holding a parameter or buffer (``nn.LSTM``'s ``_flat_weights``,
  DDP's bookkeeping).

How: the attribute is reset to what PyTorch modules start with (``None`` for a tensor or a
tuple, a new empty list or dict: the old one may be the caller's), which lets its memory go
unless something else holds it; nothing anyone else holds is destroyed.

A class that owns its tensors Torch7-style lists them in ``statekeeper_owned`` as well:
those are **emptied in place** first (``set_()`` to zero elements; an owned list or dict
is emptied too), so an outside reference to one stays the same object and sees it empty;
in place only what can be (a strided, non-inference tensor that is no parameter and has
no autograd history), the rest is only let go. Emptying in place is a promise that nothing
else uses the tensor: call it after ``backward()``, as a graph that saved an owned tensor
cannot run once it is emptied.

A module that knows better defines ``statekeeper_clear_state(self)``, or a rule is
registered for its class (:func:`register_clear_rule`); the nearest one in the class's MRO
replaces the generic clearing for that module's own attributes (it may call
``clear_state(self)``, which then clears that module's own attributes, generically, and
not its children). Each module is visited once; the generic clearing checks every
attribute before it changes any (rules run as they are met).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import torch

from statekeeper.errors import InvalidArgumentError
from statekeeper.state.attributes import INTERNALS, held_tensors

__all__ = ["ClearAction", "ClearReport", "Cleared", "clear_state", "register_clear_rule"]

M = TypeVar("M", bound=torch.nn.Module)
Rule = Callable[[torch.nn.Module], object]
_RULES: dict[type, Rule] = {}
_HOOK = "statekeeper_clear_state"
_TRANSIENT = "statekeeper_transient"
_OWNED = "statekeeper_owned"
_IN_RULE: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "statekeeper_clear_rule", default=frozenset()
)


class ClearAction(StrEnum):
    """What happened to one attribute."""

    EMPTIED = "emptied"  # owned tensors emptied in place, then the attribute reset
    RELEASED = "released"  # the attribute reset: its tensors go unless held elsewhere
    CUSTOM = "custom"  # the module's own statekeeper_clear_state() or a registered rule ran


@dataclass(frozen=True)
class Cleared:
    """One attribute (``module.path.attribute``) or module (``CUSTOM``) cleared; ``bytes``
    is the tensor data it held (each tensor counted once)."""

    path: str
    action: ClearAction
    bytes: int


@dataclass
class ClearReport:
    """What a ``clear_state`` call cleared; pass one as ``report=`` to have it filled."""

    cleared: list[Cleared] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Tensor bytes the cleared attributes held."""
        return sum(c.bytes for c in self.cleared)


def register_clear_rule(cls: type, rule: Rule) -> None:
    """Clear instances of ``cls`` (and its subclasses) with ``rule(module)`` instead of the
    generic clearing (for classes you cannot give a ``statekeeper_clear_state`` method)."""
    if not isinstance(cls, type) or not callable(rule):
        raise InvalidArgumentError(
            "register_clear_rule takes a class and a callable rule(module), "
            f"got {cls!r} and {rule!r}"
        )
    _RULES[cls] = rule


def _rule_for(module: torch.nn.Module) -> Rule | None:
    """The nearest registered rule or ``statekeeper_clear_state`` function in the MRO."""
    if id(module) in _IN_RULE.get():
        return None  # its own rule is running and asked for the generic part
    for cls in type(module).__mro__:
        if cls in _RULES:
            return _RULES[cls]
        own = vars(cls).get(_HOOK)
        if own is not None:
            if not inspect.isfunction(own):
                raise InvalidArgumentError(
                    f"{cls.__qualname__}.{_HOOK} must be a plain method (def {_HOOK}(self)), "
                    f"got {type(own).__name__}"
                )
            return own
    return None


def _nbytes(tensors: list[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if id(t) in seen or t.device.type == "meta":
            continue
        seen.add(id(t))
        with contextlib.suppress(RuntimeError, NotImplementedError):  # exotic subclasses
            total += t.numel() * t.element_size()
    return total


def _emptiable(t: torch.Tensor, model: set[int]) -> bool:
    return (
        type(t) is torch.Tensor
        and id(t) not in model
        and t.layout is torch.strided
        and not t.is_inference()
        and t.grad_fn is None
        and not t.requires_grad
    )


def _empty(t: torch.Tensor) -> None:
    with torch.no_grad():
        t.set_()  # type: ignore[call-overload]


def _reset(module: torch.nn.Module, attr: str, value: Any, owned: bool) -> None:
    if owned and isinstance(value, list | dict):
        value.clear()  # its own container, emptied: references to it stay valid
    elif isinstance(value, list | dict):
        setattr(module, attr, type(value)())  # maybe the caller's: rebound, never emptied
    else:
        setattr(module, attr, None)


@dataclass
class _Plan:
    module: torch.nn.Module
    attr: str
    value: Any
    tensors: list[torch.Tensor]
    empty: list[torch.Tensor]
    name: str
    owned: bool


def _pure(value: Any, tensors: list[torch.Tensor]) -> bool:
    """A tensor, or a container of tensors only."""
    if isinstance(value, torch.Tensor):
        return True
    items = list(value.values()) if isinstance(value, dict) else list(value)
    return len(items) == len(tensors)


def _param_view(t: torch.Tensor, model: set[int]) -> bool:
    """A view of one of the model's parameters or buffers (``self.wt = emb.weight.t()``)."""
    base = t._base if t._is_view() else None
    return base is not None and id(base) in model


def _plan(root: torch.nn.Module, report: ClearReport) -> list[_Plan]:
    model = {id(t) for t in (*root.parameters(), *root.buffers())}
    plans: list[_Plan] = []
    # called by a module's own rule for the generic part: that module's attributes alone
    walk = [("", root)] if id(root) in _IN_RULE.get() else list(root.named_modules())
    for path, sub in walk:  # each module once
        rule = _rule_for(sub)
        if rule is not None:
            token = _IN_RULE.set(_IN_RULE.get() | {id(sub)})
            try:
                rule(sub)
            finally:
                _IN_RULE.reset(token)
            report.cleared.append(Cleared(path, ClearAction.CUSTOM, 0))
            continue
        declared = set(getattr(type(sub), _TRANSIENT, ()))
        owned = set(getattr(type(sub), _OWNED, ()))
        for attr, value in vars(sub).items():
            tensors = None if attr in INTERNALS else held_tensors(value)
            if not tensors or not _pure(value, tensors):
                continue
            if any(
                isinstance(t, torch.nn.Parameter) or id(t) in model or _param_view(t, model)
                for t in tensors
            ):
                continue  # machinery (nn.LSTM's _flat_weights, DDP's lists), tied views
            graph = any(t.grad_fn is not None for t in tensors)
            if attr not in declared | owned and not graph:
                continue  # a constant of __init__ or a value that is not the forward's
            empty = [t for t in tensors if attr in owned and _emptiable(t, model)]
            name = f"{path}.{attr}" if path else attr
            plans.append(_Plan(sub, attr, value, tensors, empty, name, attr in owned))
    return plans


def clear_state(module: M, *, report: ClearReport | None = None) -> M:
    """Clear ``module``'s transient tensors, following the rules of the module docstring;
    returns ``module`` (``sk.export(clear_state(model), ...)``)."""
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(f"clear_state takes a torch.nn.Module, got {type(module)}")
    out = report if report is not None else ClearReport()
    for plan in _plan(module, out):  # planned first: nothing changes before every check
        size = _nbytes(plan.tensors)
        for t in plan.empty:
            _empty(t)
        _reset(plan.module, plan.attr, plan.value, plan.owned)
        action = ClearAction.EMPTIED if plan.empty else ClearAction.RELEASED
        out.cleared.append(Cleared(plan.name, action, size))
    return module
