"""Building a Target from what a factory returns."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from statekeeper.doctor.rule import Target
from statekeeper.errors import InvalidArgumentError

__all__ = ["build_target", "load_factory"]


def build_target(factory: Callable[[], Any], *, spec: str | None = None) -> Target:
    """Call ``factory`` and read what it returned.

    It may return an ``nn.Module``, or a dict: ``model``, ``optimizer``, ``example_input``
    (a value or a function returning one) and any other named objects of the training
    state (data loaders, schedulers...).
    """
    built = factory()
    if isinstance(built, torch.nn.Module):
        return Target({"model": built}, model=built, factory=factory, spec=spec)
    if not (isinstance(built, Mapping) and all(isinstance(k, str) for k in built)):
        raise InvalidArgumentError(
            "the doctor's factory must return an nn.Module or a dict (model=, optimizer=, "
            f"example_input=, other state entries), got {type(built).__name__}"
        )
    model = built.get("model")
    optimizer = built.get("optimizer")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(f"'model' must be an nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgumentError(
            f"'optimizer' must be a torch optimizer, got {type(optimizer).__name__}"
        )
    state = {k: v for k, v in built.items() if k != "example_input"}
    return Target(state, model, optimizer, built.get("example_input"), factory, spec)


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
