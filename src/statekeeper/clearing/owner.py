"""Whose tensor is it: what ``clear_state`` never touches, and what it may empty in place.

Emptying a tensor in place (``set_()``) changes it for every holder of that object, so only
a tensor the module itself made may be emptied:

- never a parameter or a view of one (of any model), nor a buffer or a gradient of the
  model being cleared, nor a tensor sharing storage with one of those or with another
  tensor the model holds: such attributes are machinery (``nn.LSTM``'s ``_flat_weights``,
  tied weights) or aliases, and are dropped by reference at most;
- a tensor with autograd history is taken for the module's own product when its graph,
  looked at from the tensor back (breadth first, a bounded number of nodes: a module's
  own product meets its parameters within its last few operations), reaches one of the
  module's own parameters (a cached output, a hidden state); the graph of a caller's
  tensor, or of another module's output passed through, reaches none of them. This is a
  judgement from the graph, not a proof: a module that keeps its *input* when that input
  came out of the module itself (a cell applied in a loop, weights shared with an earlier
  layer) must say so with ``statekeeper_borrowed``, as ``doctor --fix-transient`` proposes;
- a tensor without history is emptied only when the class declares it owned.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

from statekeeper.state.attributes import held_tensors, plain_attributes

__all__ = ["Guard", "emptiable", "guard_of", "is_machinery"]

_WALK_LIMIT = 256  # graph nodes looked at per tensor; past it, the tensor is not emptied

StorageKey = tuple[str, int | None, int]


@dataclass(frozen=True)
class Guard:
    """The tensors of the model being cleared that are never touched, and which distinct
    tensors own data on each storage."""

    state: frozenset[int]  # parameters, buffers, and the parameters' gradients
    storages: dict[StorageKey, frozenset[int]]


def _storage(t: torch.Tensor) -> StorageKey | None:
    try:
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            return None
        return t.device.type, t.device.index, storage.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):  # no storage to speak of
        return None


def guard_of(root: torch.nn.Module) -> Guard:
    """What ``root`` holds: its state and, storage by storage, the distinct tensors on it
    (parameters, buffers, gradients, and every tensor an attribute holds that is no view:
    emptying a tensor never changes a view's data, the view keeps the old storage)."""
    params = list(root.parameters())
    state: list[torch.Tensor] = [*params, *root.buffers()]
    state.extend(p.grad for p in params if p.grad is not None)
    found = list(state)
    for _, _, value in plain_attributes(root):
        found.extend(t for t in held_tensors(value) or () if not t._is_view())
    storages: dict[StorageKey, set[int]] = {}
    for t in found:
        key = _storage(t)
        if key is not None:
            storages.setdefault(key, set()).add(id(t))
    return Guard(frozenset(id(t) for t in state), {k: frozenset(v) for k, v in storages.items()})


def is_machinery(t: torch.Tensor, guard: Guard) -> bool:
    """A parameter (of any model), a view of one, or the model's buffer or gradient."""
    base = t._base if t._is_view() else None
    return (
        isinstance(t, torch.nn.Parameter)
        or id(t) in guard.state
        or isinstance(base, torch.nn.Parameter)
        or (base is not None and id(base) in guard.state)
    )


def _made_by(t: torch.Tensor, params: frozenset[int]) -> bool:
    """Whether ``t``'s autograd graph reaches one of ``params`` (the module's own) within
    the first ``_WALK_LIMIT`` nodes, breadth first."""
    if not params:
        return False
    seen: set[int] = set()
    queue = collections.deque([t.grad_fn])
    while queue and len(seen) < _WALK_LIMIT:
        fn = queue.popleft()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        variable = getattr(fn, "variable", None)
        if variable is not None and id(variable) in params:
            return True
        queue.extend(nxt for nxt, _ in fn.next_functions)
    return False


def emptiable(t: torch.Tensor, owned: bool, params: frozenset[int], guard: Guard) -> bool:
    """Whether ``t`` may be emptied in place: a plain tensor of the module's own making
    (``params``: the module's parameters; ``owned``: its class declares the attribute)."""
    if (
        type(t) is not torch.Tensor
        or t.layout is not torch.strided
        or t.is_nested
        or t.is_quantized
        or t.is_inference()
        or t.device.type == "meta"
        or (t.is_leaf and t.requires_grad)  # a trainable leaf: somebody's
        or t._is_view()  # its base is somebody's
        or is_machinery(t, guard)
    ):
        return False
    key = _storage(t)
    if key is None or len(guard.storages.get(key, ())) != 1:
        return False  # no data, or shared with another tensor of the model
    return owned or (t.grad_fn is not None and _made_by(t, params))
