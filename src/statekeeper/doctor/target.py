"""Building a Target from what a factory returns."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from statekeeper.doctor.rule import Target
from statekeeper.errors import InvalidArgumentError

__all__ = ["build_target", "load_factory"]


def build_target(factory: Callable[[], Any], *, spec: str | None = None) -> Target:
    """Call ``factory`` and read what it returned (:meth:`Target.build`)."""
    return Target.build(factory, spec=spec)


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
