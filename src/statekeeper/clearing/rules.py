"""Modules that clear themselves: their own method, or a rule registered for their class.

A class clears its own instances when it defines ``statekeeper_clear_state(self)`` (or a
``clear_state(self)`` method taking no other argument, the name the Torch7 heritage gives
it), or when a rule is registered for it (:func:`register_clear_rule`, for classes you
cannot edit). The nearest one in the class's MRO wins. While a module's rule runs, a
``clear_state(self)`` call inside it does the generic clearing of that module's own
attributes, with the options of the outer call.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from statekeeper.errors import InvalidArgumentError

__all__ = ["Rule", "in_rule", "register_clear_rule", "rule_for", "running_rule"]

Rule = Callable[[torch.nn.Module], object]
_RULES: dict[type, Rule] = {}
_HOOK = "statekeeper_clear_state"
_TORCH7_NAME = "clear_state"
# the modules whose rule is running
_RUNNING: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "statekeeper_clear_rule", default=frozenset()
)


def register_clear_rule(cls: type, rule: Rule) -> None:
    """Clear instances of ``cls`` (and of its subclasses) with ``rule(module)`` instead of
    the generic clearing: for classes you cannot give a ``statekeeper_clear_state`` method.
    A later registration for the same class replaces the earlier one.

    Args:
        cls: The class whose instances (and subclasses') the rule clears.
        rule: ``rule(module)``, called for each instance.

    Raises:
        InvalidArgumentError: ``cls`` is no class or ``rule`` is not callable.
    """
    if not isinstance(cls, type) or not callable(rule):
        raise InvalidArgumentError(
            "register_clear_rule takes a class and a callable rule(module), "
            f"got {cls!r} and {rule!r}"
        )
    _RULES[cls] = rule


def _takes_only_self(fn: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not inspect.Parameter.empty
        or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        for p in params
    )


def rule_for(module: torch.nn.Module) -> Rule | None:
    """The rule that clears ``module``: the nearest registered rule, own
    ``statekeeper_clear_state`` or own ``clear_state(self)`` in its class's MRO; None while
    that module's rule is running (it asked for the generic part) or when it has none."""
    if in_rule(module):
        return None
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
        named = vars(cls).get(_TORCH7_NAME)
        if inspect.isfunction(named) and _takes_only_self(named):
            return named
    return None


def in_rule(module: torch.nn.Module) -> bool:
    """Whether ``module``'s own rule is running (a ``clear_state`` call on it is then the
    generic part that the rule asked for)."""
    return id(module) in _RUNNING.get()


@contextlib.contextmanager
def running_rule(module: torch.nn.Module) -> Iterator[None]:
    """Mark ``module``'s rule as running while it runs."""
    token = _RUNNING.set(_RUNNING.get() | {id(module)})
    try:
        yield
    finally:
        _RUNNING.reset(token)
