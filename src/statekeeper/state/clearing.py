"""``clear_state(module)``: a model's transient tensors freed (Torch7's ``clearState``).

Transient tensors are what a module holds besides its parameters, buffers and submodules,
put there by its forward: cached outputs, the last hidden state of a recurrent or spiking
layer, attention caches, activations a hook keeps. ``state_dict()`` leaves them out, but
they hold memory (and often the autograd graph behind them), are pickled with the module,
and change what the next forward computes.

**Which attributes**, on each module (a tensor, or a list, tuple or dict of tensors only,
one level deep, as the doctor's SK004 looks):

- those its class lists in ``statekeeper_transient`` or ``statekeeper_borrowed``;
- any other holding a tensor with autograd history (``grad_fn``): a product of a forward;
- given a freshly constructed instance (``like=``), any other that the forward created or
  replaced (``__init__`` left none, or other tensors there), as SK004 finds them.

Never touched: parameters and buffers (of any model), attributes holding one or a view of
one (``nn.LSTM``'s ``_flat_weights``, DDP's lists, tied weights' ``emb.weight.t()``), a
container that also holds other values, and without ``like=`` a tensor with no autograd
history that nobody declared (a constant of ``__init__`` looks the same).

**How** (``mode=ClearMode.EMPTY``, Torch7's semantics): each tensor the module owns is
emptied in place (``set_()``: zero elements, same dtype and device), so a reference held
elsewhere is the same object and now sees an empty tensor. A tensor the module may not
own is only dropped by reference, never emptied: a view, a tensor sharing its storage with
another tensor of the model, a leaf that requires grad, one held in a
``statekeeper_borrowed`` attribute (an identity-like module's cached input), or, without
autograd history, one that is not declared. Then the attribute is set back to what
``__init__`` left (with ``like=``; deleted when it left none), else to ``None`` (a tensor or
a tuple) or a new empty list or dict. ``ClearMode.RELEASE`` only drops references.

**Per-batch buffers** (``include=ClearInclude.BATCH_STATE``): persistent buffers holding
the last batch's state, which the doctor's SK005 reports, are reset in place: those the
class lists in ``statekeeper_batch_state``, and with ``like=`` those whose shape or dtype
moved from ``__init__``'s; to the fresh instance's value, else zeros. No other buffer and
no parameter is ever touched.

**Modules that know better** clear themselves (:mod:`statekeeper.state.clear_rules`).
Each module is visited once; the generic clearing checks every attribute before it
changes any.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import torch

from statekeeper.errors import InvalidArgumentError
from statekeeper.state.attributes import INTERNALS, held_tensors
from statekeeper.state.clear_options import (
    ClearAction,
    Cleared,
    ClearInclude,
    ClearMode,
    ClearReport,
)
from statekeeper.state.clear_reset import (
    MISSING,
    changed_since_init,
    fresh_modules,
    fresh_value,
    initial_value,
    is_batch_state,
    reset,
)
from statekeeper.state.clear_rules import in_rule, register_clear_rule, rule_for, running_rule

__all__ = [
    "ClearAction",
    "ClearInclude",
    "ClearMode",
    "ClearReport",
    "Cleared",
    "clear_state",
    "register_clear_rule",
]

M = TypeVar("M", bound=torch.nn.Module)


@dataclass(frozen=True)
class _Options:
    mode: ClearMode
    include: ClearInclude
    fresh: dict[str, torch.nn.Module]  # module path -> the fresh instance's module


@dataclass
class _Step:
    module: torch.nn.Module
    name: str  # the attribute or buffer
    path: str
    value: Any
    tensors: list[torch.Tensor]
    empty: list[torch.Tensor]
    fresh: Any
    action: ClearAction


def _choice(enum: type[StrEnum], value: Any, what: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        options = ", ".join(repr(m.value) for m in enum)
        raise InvalidArgumentError(
            f"clear_state({what}={value!r}): choose one of {enum.__name__} ({options})"
        ) from None


def _names(module: torch.nn.Module, declaration: str) -> set[str]:
    names = getattr(type(module), declaration, ())
    if isinstance(names, str):
        names = (names,)
    if not all(isinstance(n, str) for n in names):
        raise InvalidArgumentError(
            f"{type(module).__qualname__}.{declaration} must be a tuple of attribute names, "
            f"got {names!r}"
        )
    return set(names)


def _storage(t: torch.Tensor) -> tuple[str, int | None, int] | None:
    try:
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            return None
        return t.device.type, t.device.index, storage.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):  # no storage to speak of
        return None


def _storages(root: torch.nn.Module) -> dict[tuple[str, int | None, int], set[int]]:
    """Storage -> the distinct tensors of the model that own data on it: parameters,
    buffers, and every tensor an attribute holds that is no view (emptying a tensor in
    place never changes a view's data: the view keeps the old storage)."""
    found: list[torch.Tensor] = [*root.parameters(), *root.buffers()]
    for sub in root.modules():
        for attr, value in vars(sub).items():
            if attr not in INTERNALS:
                found.extend(t for t in held_tensors(value) or () if not t._is_view())
    out: dict[tuple[str, int | None, int], set[int]] = {}
    for t in found:
        key = _storage(t)
        if key is not None:
            out.setdefault(key, set()).add(id(t))
    return out


def _owned(t: torch.Tensor, declared: bool, storages: dict[Any, set[int]]) -> bool:
    """Whether ``t`` may be emptied in place: the module's own plain tensor."""
    if (
        type(t) is not torch.Tensor
        or t.layout is not torch.strided
        or t.is_inference()
        or t.device.type == "meta"
        or (t.is_leaf and t.requires_grad)  # a trainable leaf: somebody's
        or t._is_view()  # its base is somebody's
        or not (declared or t.grad_fn is not None)  # no history, undeclared: maybe an input
    ):
        return False
    key = _storage(t)
    return key is not None and len(storages.get(key, ())) == 1


def _nbytes(t: torch.Tensor, seen: set[int]) -> int:
    if id(t) in seen or t.device.type == "meta":
        return 0
    seen.add(id(t))
    try:
        return t.numel() * t.element_size()
    except (RuntimeError, NotImplementedError):  # exotic subclasses
        return 0


def _attribute_steps(
    path: str, sub: torch.nn.Module, opts: _Options, model: set[int], storages: dict[Any, Any]
) -> list[_Step]:
    fresh_sub = opts.fresh.get(path)
    declared = _names(sub, "statekeeper_transient")
    borrowed = _names(sub, "statekeeper_borrowed")
    steps = []
    for attr, value in vars(sub).items():
        tensors = None if attr in INTERNALS else held_tensors(value)
        if not tensors or (not isinstance(value, torch.Tensor) and len(tensors) != len(value)):
            continue  # not a tensor, or a container that also holds other values
        if any(
            isinstance(t, torch.nn.Parameter)
            or id(t) in model
            or (t._is_view() and t._base is not None and id(t._base) in model)
            for t in tensors
        ):
            continue  # machinery (nn.LSTM's _flat_weights, DDP's lists), tied views
        fresh = fresh_value(fresh_sub, attr)
        if not (
            attr in declared | borrowed
            or any(t.grad_fn is not None for t in tensors)
            or (fresh_sub is not None and changed_since_init(value, tensors, fresh))
        ):
            continue  # a constant of __init__, or a value the forward did not make
        empty = []
        if opts.mode is ClearMode.EMPTY and attr not in borrowed:
            empty = [t for t in tensors if _owned(t, attr in declared, storages)]
        action = ClearAction.EMPTIED if empty else ClearAction.RELEASED
        steps.append(_Step(sub, attr, path, value, tensors, empty, fresh, action))
    return steps


def _buffer_steps(path: str, sub: torch.nn.Module, opts: _Options) -> list[_Step]:
    fresh_sub = opts.fresh.get(path)
    declared = _names(sub, "statekeeper_batch_state")
    for name in declared & set(sub._parameters):
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
        if is_batch_state(name, buf, declared, persistent, fresh):
            steps.append(_Step(sub, name, path, buf, [buf], [], fresh, ClearAction.RESET))
    return steps


def _plan(root: torch.nn.Module, opts: _Options, report: ClearReport) -> list[_Step]:
    model = {id(t) for t in (*root.parameters(), *root.buffers())}
    storages = _storages(root)
    steps: list[_Step] = []
    # called by a module's own rule for the generic part: that module's attributes alone
    walk = [("", root)] if in_rule(root) is not None else list(root.named_modules())
    for path, sub in walk:  # each module once
        rule = rule_for(sub)
        if rule is not None:
            fresh = opts.fresh.get(path)
            with running_rule(sub, _Options(opts.mode, opts.include, {"": fresh} if fresh else {})):
                rule(sub)
            report.cleared.append(Cleared(path, ClearAction.CUSTOM, 0))
            continue
        steps.extend(_attribute_steps(path, sub, opts, model, storages))
        if opts.include is ClearInclude.BATCH_STATE:
            steps.extend(_buffer_steps(path, sub, opts))
    return steps


def _apply(step: _Step) -> None:
    if step.action is ClearAction.RESET:
        reset(step.value, step.fresh)
        return
    with torch.no_grad():
        for t in step.empty:
            t.set_()  # type: ignore[call-overload]
    value = initial_value(step.value, step.fresh, step.tensors[0].device)
    if value is MISSING:
        delattr(step.module, step.name)
    else:
        setattr(step.module, step.name, value)


def clear_state(
    module: M,
    *,
    mode: ClearMode | str | None = None,
    include: ClearInclude | str | None = None,
    like: torch.nn.Module | None = None,
    report: ClearReport | None = None,
) -> M:
    """Free ``module``'s transient tensors (the rules are in this module's docstring);
    returns ``module``, so ``sk.export(sk.clear_state(model), ...)`` reads naturally.

    ``mode`` (default ``ClearMode.EMPTY``), ``include`` (default
    ``ClearInclude.TRANSIENT``), ``like``: a freshly constructed instance of the model's
    class, which finds the transient tensors a forward made without autograd history and
    gives each attribute back the value ``__init__`` left. ``report`` is filled with what
    was cleared."""
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(f"clear_state takes a torch.nn.Module, got {type(module)}")
    outer: _Options | None = in_rule(module)
    opts = _Options(
        _choice(ClearMode, mode, "mode") if mode is not None
        else outer.mode if outer else ClearMode.EMPTY,
        _choice(ClearInclude, include, "include") if include is not None
        else outer.include if outer else ClearInclude.TRANSIENT,
        fresh_modules(module, like) if like is not None else outer.fresh if outer else {},
    )  # fmt: skip
    out = report if report is not None else ClearReport()
    seen: set[int] = set()
    for step in _plan(module, opts, out):  # planned first: nothing changes before every check
        size = sum(_nbytes(t, seen) for t in step.tensors)
        _apply(step)
        out.cleared.append(Cleared(f"{step.path}.{step.name}".lstrip("."), step.action, size))
    return module
