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
    "Cast",
    "NO_FRESH",
    "changed_since_init",
    "derived",
    "fresh_modules",
    "fresh_value",
    "initial_value",
    "is_batch_state",
    "reset",
]

MISSING = object()  # the fresh instance has no such attribute: the forward added it
NO_FRESH = object()  # no fresh instance was given


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
    meta = next((k for k, t in like.state_dict().items() if t.device.type == "meta"), None)
    if meta is not None:
        raise InvalidArgumentError(
            f"clear_state(like=...): the fresh instance's '{meta}' is on the meta device, so "
            "it has no values to give back; build it on a real device (CPU is fine)"
        )
    mine = dict(module.named_modules())
    theirs = dict(like.named_modules())
    for path, sub in mine.items():
        other = theirs.get(path)
        if other is None or _kind(other) is not _kind(sub):
            found = "nothing" if other is None else type(other).__qualname__
            raise InvalidArgumentError(
                f"clear_state(like=...): the model has {type(sub).__qualname__} at "
                f"'{path or 'the root'}' and the fresh instance {found}; build `like` with "
                "the same class and arguments as the model, wrapped the same way (DDP, "
                "torch.compile), or pass the wrapped module and its fresh twin"
            )
    return theirs


def _kind(module: torch.nn.Module) -> type:
    """The class a module was written as: a parametrized module's class is made per
    instance (``ParametrizedLinear``), its first base is the written one."""
    cls = type(module)
    if getattr(module, "parametrizations", None) is not None and cls.__bases__:
        return cls.__bases__[0]
    return cls


def fresh_value(fresh: torch.nn.Module | None, attr: str) -> Any:
    """The attribute (or non-persistent buffer) as ``__init__`` left it on the fresh module:
    MISSING when it has none, NO_FRESH when no fresh instance was given."""
    if fresh is None:
        return NO_FRESH
    if attr in fresh._buffers:
        return fresh._buffers[attr]
    return vars(fresh).get(attr, MISSING)


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "float"
    return "complex" if dtype.is_complex else str(dtype)


def changed_since_init(value: Any, tensors: list[torch.Tensor], fresh: Any) -> bool:
    """Whether a forward created or replaced this tensor attribute, by its structure: the
    fresh instance has no such attribute, something else than tensors there (``None``, a
    float), or tensors of other shapes or kinds of dtype (an empty placeholder, a state
    that follows the batch; a float constant cast with the model is still the same).
    Values are not compared: two instances differ in every random constant of
    ``__init__`` (random features, an anchor copy of the weights) that no forward touched."""
    if fresh is MISSING:
        return True
    theirs = held_tensors(fresh)
    if theirs is None or type(fresh) is not type(value) or len(theirs) != len(tensors):
        return True
    if isinstance(value, dict) and list(value) != list(fresh):
        return True
    return any(
        a.shape != b.shape or _dtype_kind(a.dtype) != _dtype_kind(b.dtype)
        for a, b in zip(tensors, theirs, strict=True)
    )


def derived(fresh: Any) -> bool:
    """Whether ``__init__`` computed the attribute from parameters (it has autograd history
    on the fresh instance: tied weights, a weight-norm ``weight``): the module's machinery,
    recomputed by the module itself, never a forward's leftover."""
    tensors = held_tensors(fresh) if fresh is not MISSING and fresh is not NO_FRESH else None
    return any(t.grad_fn is not None for t in tensors or ())


Cast = tuple[torch.dtype, torch.dtype] | None  # (the fresh module's dtype, the model's)


def _copied(value: Any, device: torch.device | None, cast: Cast) -> Any:
    """A copy of a fresh instance's value: tensors cloned (on ``device``; those in the
    fresh module's floating dtype cast to the model's), containers of the same type (a
    namedtuple, a defaultdict) rebuilt around them."""
    if isinstance(value, torch.Tensor):
        t = value.detach().clone()
        dtype = cast[1] if cast is not None and t.dtype == cast[0] else None
        return t.to(device=device, dtype=dtype) if device is not None or dtype else t
    if isinstance(value, tuple):
        items = [_copied(v, device, cast) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, list | dict):
        new = copy.copy(value)
        keys = range(len(value)) if isinstance(value, list) else list(value)
        for k in keys:
            new[k] = _copied(value[k], device, cast)
        return new
    return copy.deepcopy(value)


def initial_value(value: Any, fresh: Any, device: torch.device | None, cast: Cast) -> Any:
    """What a cleared attribute is set to: a copy of the fresh instance's value (tensors on
    the device the cleared ones were on), MISSING when it has none (the attribute is
    deleted), else None for a tensor or a tuple, a new empty list or dict."""
    if fresh is MISSING:
        return MISSING
    if fresh is not NO_FRESH:
        return _copied(fresh, device, cast)
    if isinstance(value, list | dict):
        return type(value)()  # a new one: the old one may be the caller's
    return None


def is_batch_state(
    name: str, buf: torch.Tensor, declared: set[str], persistent: bool, fresh: Any
) -> bool:
    """A buffer holding per-batch state: declared so by its class, or (with a fresh
    instance) a persistent buffer whose leading dimension alone moved from a non-empty
    ``__init__`` value, as a state that follows the batch size does. Running statistics
    keep their shape; a buffer ``__init__`` left empty and a setup step filled (an
    observer's ``min_val``, a table) is the model's, not the batch's."""
    if name in declared:
        return True
    if not persistent or not isinstance(fresh, torch.Tensor) or fresh.numel() == 0:
        return False
    return (  # (batch, features...): a per-channel scale of shape (C,) is no batch state
        fresh.dim() == buf.dim() >= 2
        and fresh.shape[0] != buf.shape[0]
        and fresh.shape[1:] == buf.shape[1:]
    )


def reset(module: torch.nn.Module, name: str, buf: torch.Tensor, fresh: Any) -> None:
    """Put a per-batch buffer back: in place (references to it see it) to the fresh
    instance's value, in the buffer's dtype and on its device; to ``None`` when ``__init__``
    registered none; zeros without a fresh instance (as recurrent and membrane states
    start, in the shape the buffer has now)."""
    if fresh is None or fresh is MISSING:
        module._buffers[name] = None
        return
    with torch.no_grad(), torch.inference_mode(buf.is_inference()):
        if isinstance(fresh, torch.Tensor):
            new = fresh.detach().to(device=buf.device, dtype=buf.dtype)
            if new.shape == buf.shape:
                buf.copy_(new)
            else:
                buf.set_(new.clone())  # type: ignore[call-overload]
        else:
            buf.zero_()
