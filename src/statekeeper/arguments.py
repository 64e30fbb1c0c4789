"""Checking what callers pass, once, in one place: each check names the argument and the fix.

The public functions and options take their documented types only: a bool option takes
``True`` or ``False`` (never ``"yes"``, ``1`` or ``None``), a mapping argument a mapping, a
callback a callable. A value of the wrong type is an :class:`InvalidArgumentTypeError`
(also a ``TypeError``); a value of the right type out of range an
:class:`InvalidArgumentError` (also a ``ValueError``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from statekeeper.errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "require_bool",
    "require_callable",
    "require_count",
    "require_instance",
    "require_mapping",
    "require_path",
    "require_seconds",
    "require_step",
]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def require_bool(name: str, value: object) -> bool:
    """``value`` when it is ``True`` or ``False``; ``InvalidArgumentTypeError`` otherwise."""
    if not isinstance(value, bool):
        raise InvalidArgumentTypeError(
            f"{name} must be True or False, got {_shown(value)} ({type(value).__name__}); "
            f"pass {name}=True or {name}=False"
        )
    return value


def require_mapping(name: str, value: object, what: str, *, optional: bool = False) -> Any:
    """``value`` when it is a ``Mapping`` (or None with ``optional``); ``what`` says what it
    maps, as the fix: ``"names to objects, e.g. {'model': model}"``."""
    if value is None and optional:
        return value
    if not isinstance(value, Mapping):
        raise InvalidArgumentTypeError(
            f"{name} must be a mapping of {what}, got {type(value).__name__} {_shown(value)}"
        )
    return value


def require_callable(name: str, value: object, what: str, *, optional: bool = True) -> Any:
    """``value`` when it is callable (or None with ``optional``); ``what`` is its signature,
    as the fix."""
    if (value is not None or not optional) and not callable(value):
        raise InvalidArgumentTypeError(
            f"{name} must be a callable {what}{' (or None)' if optional else ''}, got "
            f"{type(value).__name__} {_shown(value)}"
        )
    return value


def require_step(value: object, name: str = "step") -> int:
    """``value`` when it is an ``int`` >= 0."""
    if type(value) is not int:  # bools and int subclasses too: a step is a plain int
        raise InvalidArgumentTypeError(
            f"{name} must be a non-negative int, got {type(value).__name__} {_shown(value)}; "
            f"pass the training step number, e.g. {name}=100"
        )
    if value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int, got {value}")
    return value


def require_instance(name: str, value: object, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` when it is an instance of ``kind`` (``what`` names it, as the fix: ``"a
    retention policy such as KeepLatest(3)"``); ``InvalidArgumentTypeError`` otherwise."""
    if not isinstance(value, kind):
        raise InvalidArgumentTypeError(
            f"{name} must be {what}, got {type(value).__name__} {_shown(value)}"
        )
    return value


def require_path(name: str, value: object, kinds: tuple[type, ...] = ()) -> Any:
    """``value`` when it is a ``str`` or ``os.PathLike`` (or one of ``kinds``, such as a
    Storage)."""
    if isinstance(value, (str, os.PathLike, *kinds)):
        return value
    extra = "".join(f", a {k.__name__}" for k in kinds)
    raise InvalidArgumentTypeError(
        f"{name} must be a URL or path (str, os.PathLike{extra}), got "
        f"{type(value).__name__} {_shown(value)}; pass e.g. {name}='s3://bucket/run'"
    )


def require_count(name: str, value: object, *, minimum: int = 0) -> int:
    """``value`` when it is an ``int`` (never a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(
            f"{name} must be an int >= {minimum}, got {type(value).__name__} {_shown(value)}"
        )
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def require_seconds(
    name: str, value: object, *, zero: bool = False, optional: bool = False
) -> float | None:
    """``value`` when it is a number of seconds (int or float, never a bool), finite and
    > 0 (>= 0 with ``zero``); None too with ``optional`` (it waits for ever)."""
    if value is None and optional:
        return None
    fix = " (or None: wait for ever)" if optional else ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentTypeError(
            f"{name} must be seconds (an int or float){fix}, got {type(value).__name__} "
            f"{_shown(value)}"
        )
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise InvalidArgumentError(
            f"{name} must be a finite number of seconds {'>= 0' if zero else '> 0'}{fix}, "
            f"got {value!r}"
        )
    return float(value)
