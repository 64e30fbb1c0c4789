"""``clear_state(module)``: a model's transient tensors freed (Torch7's ``clearState``).

Transient tensors are what a module holds besides its parameters, buffers and submodules,
put there by its forward: cached outputs, the last hidden state of a recurrent or spiking
layer, attention caches, activations a hook keeps. ``state_dict()`` leaves them out, but
they hold memory (and often the autograd graph behind them), are pickled with the module,
and change what the next forward computes.

**Which attributes**, on each module (a tensor, or a list, tuple or dict of tensors and
``None`` only, one level deep, as the doctor's SK004 looks):

- those its class lists in ``statekeeper_transient``, ``statekeeper_owned`` or
  ``statekeeper_borrowed``;
- any other holding a tensor with autograd history (``grad_fn``): a product of a forward;
- given a freshly constructed instance (``like=``), any other that the forward created or
  replaced (``__init__`` left none, no tensors, or tensors of other shapes or kinds of
  dtype there); with it, a declared attribute holding no tensors (a position counter) is
  given back what ``__init__`` left too.

Never touched: parameters (of any model) and views of them, the model's buffers and
gradients, attributes holding any of these (``nn.LSTM``'s ``_flat_weights``, DDP's lists,
tied weights' ``emb.weight.t()``), a container that also holds other values, and without
``like=`` a tensor with no autograd history that nobody declared (a constant of
``__init__`` looks the same).

**How** (``mode=ClearMode.EMPTY``, Torch7's semantics): each tensor the module made is
emptied in place (``set_()``: zero elements, same dtype and device), so a reference held
elsewhere is the same object and now sees an empty tensor. Made by the module: its
autograd graph reaches the module's own parameters, or the class declares the attribute
``statekeeper_owned`` (:mod:`statekeeper.clearing.owner`). Any other tensor is dropped
by reference, never emptied: the caller's input an identity-like module caches, another
module's output, a view, a tensor sharing storage. Then the attribute is set back to what
``__init__`` left (with ``like=``; deleted when it left none), else to ``None`` (a tensor or
a tuple) or a new empty list or dict. ``ClearMode.RELEASE`` only drops references.

**Per-batch buffers** (``include=ClearInclude.BATCH_STATE``): persistent buffers holding
the last batch's state, which the doctor's SK005 reports, are reset in place: those the
class lists in ``statekeeper_batch_state``, and with ``like=`` those whose leading
dimension alone moved from a non-empty ``__init__`` value; to the fresh instance's value,
else zeros. No other buffer and no
parameter is ever touched.

**Modules that know better** clear themselves (:mod:`statekeeper.clearing.rules`).
Each module is cleared once per call, also when a rule clears its children with
``clear_state``; every declaration is checked before anything changes.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch

from statekeeper.clearing.options import (
    ClearAction,
    Cleared,
    ClearInclude,
    ClearMode,
    ClearReport,
)
from statekeeper.clearing.owner import Guard, guard_of
from statekeeper.clearing.plan import (
    Step,
    attribute_steps,
    buffer_steps,
    check_declarations,
    floating_dtype,
    nbytes,
)
from statekeeper.clearing.reset import MISSING, Cast, fresh_modules, initial_value, reset
from statekeeper.clearing.rules import in_rule, register_clear_rule, rule_for, running_rule
from statekeeper.errors import InvalidArgumentError, StatekeeperError

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
class _Call:
    """One ``clear_state`` call on the outermost model, shared with the calls its rules
    make: the options, what is never touched, and what was cleared already."""

    mode: ClearMode
    include: ClearInclude
    fresh: dict[str, torch.nn.Module]  # module path -> the fresh instance's module
    guard: Guard
    paths: dict[int, str]  # id(module) -> its path in the outermost model
    reports: tuple[ClearReport, ...]
    done: set[int] = field(default_factory=set)  # modules cleared
    seen: set[int] = field(default_factory=set)  # tensors counted


_ACTIVE: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "statekeeper_clear_call", default=None
)


def _choice(enum: type[ClearMode] | type[ClearInclude], value: Any, what: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        options = ", ".join(repr(m.value) for m in enum)
        raise InvalidArgumentError(
            f"clear_state({what}={value!r}): choose one of {enum.__name__} ({options})"
        ) from None


def _run_rule(rule: Any, path: str, sub: torch.nn.Module) -> None:
    with running_rule(sub):
        try:
            rule(sub)
        except StatekeeperError:
            raise
        except Exception as exc:
            raise InvalidArgumentError(
                f"clearing {type(sub).__qualname__} at '{path or 'the root'}': its clear rule "
                f"raised {type(exc).__name__}: {exc}; fix the rule (its "
                "statekeeper_clear_state/clear_state method, or the one registered with "
                "statekeeper.clearing.register_clear_rule)"
            ) from exc


def _record(call: _Call, entry: Cleared) -> None:
    for report in call.reports:
        report.cleared.append(entry)


def _clear(root: torch.nn.Module, call: _Call, own_only: bool) -> None:
    """Clear ``root``'s subtree (or, for a rule asking for the generic part, its own
    attributes): rules as they are met, then every generic step, once all are planned."""
    subs = [root] if own_only else [m for _, m in root.named_modules()]
    walk = [(call.paths[id(m)], m) for m in subs if own_only or id(m) not in call.done]
    for _, sub in walk:  # every declaration checked before anything changes
        check_declarations(sub)
    steps: list[Step] = []
    for path, sub in walk:
        if id(sub) in call.done and not (own_only and sub is root):
            continue  # cleared meanwhile, by a rule that cleared its children
        call.done.add(id(sub))
        rule = rule_for(sub)
        if rule is not None:
            _run_rule(rule, path, sub)
            _record(call, Cleared(path, ClearAction.CUSTOM, 0))
            continue
        steps.extend(attribute_steps(path, sub, call.fresh.get(path), call.mode, call.guard))
        if call.include is ClearInclude.BATCH_STATE:
            steps.extend(buffer_steps(path, sub, call.fresh.get(path)))
    for step in steps:
        size = sum(nbytes(t, call.seen) for t in step.tensors)
        _apply(step)
        _record(call, Cleared(f"{step.path}.{step.name}".lstrip("."), step.action, size))


def _placement(step: Step) -> tuple[torch.device | None, Cast]:
    """Where values given back go: the cleared tensors' device, else the module's; and
    the module's floating dtype (its parameters', never a leftover's, which autocast may
    have made bf16), applied only to fresh tensors in the fresh module's own floating dtype
    (a float64 constant of ``__init__`` stays float64)."""
    own = [*step.tensors, *step.module.parameters(), *step.module.buffers()]
    device = own[0].device if own else None
    dtype = floating_dtype(step.module)
    if dtype is None or step.fresh_dtype is None or dtype == step.fresh_dtype:
        return device, None
    return device, (step.fresh_dtype, dtype)


def _apply(step: Step) -> None:
    if step.action is ClearAction.RESET:
        reset(step.module, step.name, step.value, step.fresh)
        return
    emptied = 0
    with torch.no_grad():
        for t in step.empty:
            try:
                t.set_()  # type: ignore[call-overload]
                emptied += 1
            except (RuntimeError, NotImplementedError):  # a kind that cannot be: dropped only
                pass
    if not emptied:
        step.action = ClearAction.RELEASED
    value = initial_value(step.value, step.fresh, *_placement(step))
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
    returns ``module``, so ``sk.conversion.export(sk.clearing.clear_state(model), ...)`` reads
    naturally.

    ``mode`` (default ``ClearMode.EMPTY``), ``include`` (default
    ``ClearInclude.TRANSIENT``), ``like``: a freshly constructed instance of the model's
    class, which finds the transient tensors a forward made without autograd history and
    gives each attribute back the value ``__init__`` left. ``report`` is filled with what
    was cleared (paths from the outermost model, when a rule makes the call).

    Args:
        module: The model (a ``torch.nn.Module``) to clear, in place.
        mode: :class:`ClearMode`: ``EMPTY`` (default) or ``RELEASE``.
        include: :class:`ClearInclude`: ``TRANSIENT`` (default) or also ``BATCH_STATE``.
        like: A freshly constructed instance of the model's class.
        report: A :class:`ClearReport` to fill with what was cleared.

    Returns:
        ``module`` itself.

    Raises:
        InvalidArgumentError: ``module`` is no ``torch.nn.Module``, an option is invalid, or a
            registered rule failed (the message names the rule).
    """
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(f"clear_state takes a torch.nn.Module, got {type(module)}")
    chosen_mode = None if mode is None else _choice(ClearMode, mode, "mode")
    chosen_include = None if include is None else _choice(ClearInclude, include, "include")
    fresh = fresh_modules(module, like)
    reports = () if report is None else (report,)
    active = _ACTIVE.get()
    if active is None or id(module) not in active.paths:  # a call of its own
        call = _Call(
            chosen_mode or ClearMode.EMPTY,
            chosen_include or ClearInclude.TRANSIENT,
            fresh,
            guard_of(module),
            {id(m): p for p, m in module.named_modules()},
            reports or (ClearReport(),),
        )
        token = _ACTIVE.set(call)
        try:
            _clear(module, call, own_only=False)
        finally:
            _ACTIVE.reset(token)
        return module
    # made by a rule, on a module of the model being cleared: its options unless given
    prefix = active.paths[id(module)]
    call = replace(
        active,
        mode=chosen_mode or active.mode,
        include=chosen_include or active.include,
        fresh={f"{prefix}.{p}".strip("."): m for p, m in fresh.items()}
        if like is not None
        else active.fresh,
        reports=(*active.reports, *(r for r in reports if all(r is not x for x in active.reports))),
    )
    _clear(module, call, own_only=in_rule(module))
    return module
