"""What a cleared attribute or buffer goes back to: what ``__init__`` left, when a freshly
constructed instance is given (``like=``), else the value PyTorch modules start with.

A fresh instance tells the two things a module cannot tell about itself: which tensor
attributes a forward created or replaced (the rest are constants of ``__init__``, the
doctor's SK004 draws the same line), and the value each had when it was constructed.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from statekeeper.errors import InvalidArgumentError
from statekeeper.state.attributes import held_tensors

__all__ = [
    "MISSING",
    "changed_since_init",
    "fresh_modules",
    "fresh_value",
    "initial_value",
    "is_batch_state",
    "reset",
]

MISSING = object()  # the fresh instance has no such attribute: the forward added it


def fresh_modules(
    module: torch.nn.Module, like: torch.nn.Module | None
) -> dict[str, torch.nn.Module]:
    """Path -> the fresh instance's module at that path; checks ``like`` has the same
    structure (same class, same submodule paths and classes)."""
    if like is None:
        return {}
    if not isinstance(like, torch.nn.Module) or like is module:
        raise InvalidArgumentError(
            "clear_state(like=...) takes a freshly constructed instance of the model's class "
            f"(another object than the model), got {type(like).__name__}"
        )
    mine = dict(module.named_modules())
    theirs = dict(like.named_modules())
    for path, sub in mine.items():
        other = theirs.get(path)
        if other is None or type(other) is not type(sub):
            found = "nothing" if other is None else type(other).__qualname__
            raise InvalidArgumentError(
                f"clear_state(like=...): the model has {type(sub).__qualname__} at "
                f"'{path or 'the root'}' and the fresh instance {found}; build `like` with "
                "the same class and arguments as the model"
            )
    return theirs


def fresh_value(fresh: torch.nn.Module | None, attr: str) -> Any:
    """The attribute as ``__init__`` left it on the fresh module, MISSING when it has none,
    None when no fresh instance was given."""
    if fresh is None:
        return None
    return vars(fresh).get(attr, MISSING)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    try:
        return bool(torch.equal(a.detach(), b.detach().to(a.device)))
    except (RuntimeError, NotImplementedError):  # meta, exotic subclasses: take it as same
        return True


def changed_since_init(value: Any, tensors: list[torch.Tensor], fresh: Any) -> bool:
    """Whether a forward created or replaced this tensor attribute: the fresh instance has
    no such attribute, no tensors there, or other ones."""
    if fresh is MISSING:
        return True
    theirs = held_tensors(fresh)
    if theirs is None or type(fresh) is not type(value) or len(theirs) != len(tensors):
        return True
    if isinstance(value, dict) and list(value) != list(fresh):
        return True
    return not all(_same_tensor(a, b) for a, b in zip(tensors, theirs, strict=True))


def _copied(value: Any, device: torch.device | None) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach().clone()
        return t.to(device) if device is not None else t
    if isinstance(value, list | tuple):
        return type(value)(_copied(v, device) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _copied(v, device)) for k, v in value.items())
    return copy.deepcopy(value)


def initial_value(value: Any, fresh: Any, device: torch.device | None) -> Any:
    """What a cleared attribute is set to: a copy of the fresh instance's value (tensors on
    the device the cleared ones were on), MISSING when it has none (the attribute is
    deleted), else None for a tensor or a tuple, a new empty list or dict."""
    if fresh is MISSING:
        return MISSING
    if fresh is not None:
        return _copied(fresh, device)
    if isinstance(value, list | dict):
        return type(value)()  # a new one: the old one may be the caller's
    return None


def is_batch_state(
    name: str, buf: torch.Tensor, declared: set[str], persistent: bool, fresh: Any
) -> bool:
    """A buffer holding per-batch state: declared so by its class, or (with a fresh
    instance) a persistent buffer whose shape or dtype has moved from what ``__init__``
    made, as a buffer that follows the batch does. Running statistics keep their shape."""
    if name in declared:
        return True
    if not persistent or not isinstance(fresh, torch.Tensor):
        return False
    return fresh.shape != buf.shape or fresh.dtype != buf.dtype


def reset(buf: torch.Tensor, fresh: Any) -> None:
    """Put a per-batch buffer back in place (references to it stay valid): the fresh
    instance's value, else zeros (as recurrent and membrane states start)."""
    with torch.no_grad():
        if isinstance(fresh, torch.Tensor):
            new = fresh.detach().to(buf.device)
            if new.shape == buf.shape and new.dtype == buf.dtype:
                buf.copy_(new)
            else:
                buf.set_(new.clone())  # type: ignore[call-overload]
        else:
            buf.zero_()
