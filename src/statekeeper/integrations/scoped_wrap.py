"""A module attribute wrapped once, acting only inside a context: the pattern the Trainer
integration uses to change one function of ``transformers.trainer`` for its own calls
(``safe_removal``, ``resuming``) while other threads and other code see the original."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, TypeVar

__all__ = ["wrapped_while"]

T = TypeVar("T")


@contextlib.contextmanager
def wrapped_while(
    module: Any,
    attribute: str,
    wrapper: type[Any],
    var: contextvars.ContextVar[T],
    value: T,
) -> Iterator[None]:
    """``module.attribute`` replaced by ``wrapper(original)`` unless it is one already (the
    wrapper is a class; it is installed once and stays), and ``var`` set to ``value`` while
    inside (in this thread or task): the wrapper reads ``var`` to know whether to act."""
    if not isinstance(getattr(module, attribute), wrapper):
        setattr(module, attribute, wrapper(getattr(module, attribute)))
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
