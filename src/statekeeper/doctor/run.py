"""Running every rule on a model or a training state."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from statekeeper.doctor.finding import Finding
from statekeeper.doctor.rule import Rule, Target
from statekeeper.doctor.rules import RULES
from statekeeper.errors import InvalidArgumentError

__all__ = ["diagnose", "load_factory"]


def _as_state(built: Any) -> Mapping[str, Any]:
    if isinstance(built, torch.nn.Module):
        return {"model": built}
    if isinstance(built, Mapping) and all(isinstance(k, str) for k in built):
        return built
    raise InvalidArgumentError(
        f"the doctor diagnoses an nn.Module or a training state (a dict of names to objects), "
        f"got {type(built).__name__}"
    )


def diagnose(target: Any, *, rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    """Every finding of every rule for ``target``: a module, a state, or a factory of either."""
    factory: Callable[[], Any] | None = None
    if callable(target) and not isinstance(target, torch.nn.Module):
        factory = target
        target = factory()
    subject = Target(_as_state(target), factory)
    return [finding for rule in rules for finding in rule.check(subject)]


def load_factory(spec: str) -> Callable[[], Any]:
    """``"package.module:function"`` -> the function (the current directory is importable)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgumentError(
            f"{spec!r}: name a factory as 'module:function' (e.g. train:build)"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgumentError(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidArgumentError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InvalidArgumentError(f"{spec!r} is not callable")
    return obj  # type: ignore[no-any-return]
