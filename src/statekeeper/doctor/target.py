"""Building a Target from what a factory returns."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from statekeeper.doctor.rule import Target
from statekeeper.errors import InvalidArgumentError, StatekeeperError

__all__ = ["build_target", "load_factory"]


def build_target(factory: Callable[[], Any], *, spec: str | None = None) -> Target:
    """Call ``factory`` and read what it returned (:meth:`Target.build`).

    An exception the factory raises becomes an ``InvalidArgumentError`` naming the factory,
    the exception and the fix (chained: ``__cause__`` is the factory's own exception)."""
    try:
        return Target.build(factory, spec=spec)
    except StatekeeperError:
        raise
    except Exception as exc:
        name = spec or getattr(factory, "__qualname__", None) or repr(factory)
        raise InvalidArgumentError(
            f"the factory {name} raised {type(exc).__name__}: {exc}. The doctor calls it to "
            "build the model it checks; fix the factory (calling it in Python shows the "
            "traceback)"
        ) from exc


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
    except Exception as exc:  # the module's own code failed while it was imported
        raise InvalidArgumentError(
            f"importing {module_name!r} raised {type(exc).__name__}: {exc}; fix that module "
            f"(python -c 'import {module_name}' shows the traceback)"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidArgumentError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InvalidArgumentError(f"{spec!r} is not callable")
    return obj  # type: ignore[no-any-return]
