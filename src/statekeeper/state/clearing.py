"""``clear_state(module)``: a model's transient tensors freed in place (Torch7's ``clearState``).

Transient tensors are what a module holds besides its parameters, buffers and submodules:
cached outputs, the last forward's hidden state, attention caches, activations kept by a
hook (found as the doctor's SK004 finds them: tensor attributes, or lists, tuples and dicts
of tensors one level deep). ``state_dict()`` leaves them out, but they hold memory, are
pickled with the module, and change what the next forward computes.

The rules (Torch7's design discussion, kept):

- a tensor the module owns is **emptied in place** (``set_()`` to zero elements, its autograd
  history dropped): an outside reference to it stays the same object and sees it empty;
- then the attribute goes back to what PyTorch modules start with: ``None`` for a tensor,
  the same list or dict emptied, an empty tuple (a module constructed otherwise, such as
  ``self.output = torch.empty(0)``, defines its own ``clear_state``);
- a tensor the module does **not** own is only **dropped by reference** (the attribute
  reset as above) and never emptied, or its owner's data would be destroyed: a view of
  another tensor, a tensor sharing storage with a parameter or buffer, one held by an
  earlier module of the traversal (a module whose cached output is another module's cached
  output), and every tensor a module declares borrowed in its class attribute
  ``statekeeper_borrowed`` (attribute names: an identity-like module whose cached output
  *is* its input lists ``"output"``, so the caller's input survives);
- a module that knows better defines ``clear_state(self)``, or a rule is registered for its
  class (:func:`register_clear_rule`); it is called instead of the generic clearing, for that
  module's own attributes;
- parameters and buffers are never touched; each module is visited once, however often it
  is reachable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import torch

from statekeeper.errors import InvalidArgumentError
from statekeeper.state.attributes import INTERNALS, held_tensors

__all__ = ["ClearAction", "ClearReport", "Cleared", "clear_state", "register_clear_rule"]

M = TypeVar("M", bound=torch.nn.Module)
_RULES: dict[type, Callable[[torch.nn.Module], object]] = {}
_OWN_METHOD = "clear_state"
_BORROWED = "statekeeper_borrowed"


class ClearAction(StrEnum):
    """What happened to one attribute."""

    EMPTIED = "emptied"  # owned tensors set to zero elements in place
    DROPPED = "dropped"  # not owned: the reference dropped, the tensor untouched
    CUSTOM = "custom"  # the module's own clear_state() or a registered rule ran


@dataclass(frozen=True)
class Cleared:
    """One attribute ``clear_state`` cleared: ``path`` is ``module.path.attribute``."""

    path: str
    action: ClearAction
    bytes: int


@dataclass
class ClearReport:
    """What a ``clear_state`` call freed; pass one as ``report=`` to have it filled."""

    cleared: list[Cleared] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Bytes of tensor data emptied in place (dropped references free memory only when
        nothing else holds the tensor)."""
        return sum(c.bytes for c in self.cleared if c.action is ClearAction.EMPTIED)


def register_clear_rule(cls: type, rule: Callable[[torch.nn.Module], object]) -> None:
    """Clear instances of ``cls`` (and its subclasses) with ``rule(module)`` instead of the
    generic clearing (for classes you cannot give a ``clear_state`` method)."""
    if not isinstance(cls, type) or not callable(rule):
        raise InvalidArgumentError(
            "register_clear_rule takes a class and a callable rule(module), "
            f"got {cls!r} and {rule!r}"
        )
    _RULES[cls] = rule


def _rule_for(module: torch.nn.Module) -> Callable[[torch.nn.Module], object] | None:
    for cls in type(module).__mro__:
        if cls in _RULES:
            return _RULES[cls]
    own = getattr(type(module), _OWN_METHOD, None)
    return (lambda m: own(m)) if callable(own) else None


def _storage(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, sparse...)
        return 0


def _nbytes(t: torch.Tensor) -> int:
    try:
        return t.numel() * t.element_size()
    except (RuntimeError, NotImplementedError):
        return 0


def _empty(t: torch.Tensor) -> None:
    with torch.no_grad():
        if t.grad_fn is not None:
            t.detach_()  # its autograd graph (and what the graph saved) goes too
        t.set_()  # type: ignore[call-overload]
    t.grad = None


def _drop(module: torch.nn.Module, attr: str, value: Any) -> None:
    if isinstance(value, list | dict):
        value.clear()  # the same container, emptied: references to it stay valid
    elif isinstance(value, tuple):
        setattr(module, attr, ())
    else:
        setattr(module, attr, None)


def clear_state(module: M, *, report: ClearReport | None = None) -> M:
    """Free ``module``'s transient tensors in place, following the rules of the module
    docstring; returns ``module`` (``sk.export(clear_state(model), ...)``)."""
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(f"clear_state takes a torch.nn.Module, got {type(module)}")
    out = report if report is not None else ClearReport()
    protected = {_storage(t) for t in (*module.parameters(), *module.buffers())}
    protected |= {_storage(p.grad) for p in module.parameters() if p.grad is not None}
    seen: set[int] = set()
    for path, sub in module.named_modules():  # each module once
        rule = _rule_for(sub)
        if rule is not None:
            rule(sub)
            out.cleared.append(Cleared(path, ClearAction.CUSTOM, 0))
            continue
        borrowed = set(getattr(type(sub), _BORROWED, ()))
        for attr, value in list(vars(sub).items()):
            tensors = None if attr in INTERNALS else held_tensors(value)
            if not tensors:
                continue
            name = f"{path}.{attr}" if path else attr
            keys = [_storage(t) for t in tensors]
            owned = (
                attr not in borrowed
                and not any(t._is_view() for t in tensors)
                and not any(k in protected or k in seen for k in keys if k)
            )
            seen.update(k for k in keys if k)
            if owned:
                size = sum(_nbytes(t) for t in tensors)
                for t in tensors:
                    _empty(t)
                out.cleared.append(Cleared(name, ClearAction.EMPTIED, size))
            else:
                out.cleared.append(Cleared(name, ClearAction.DROPPED, 0))
            _drop(sub, attr, value)
    return module
