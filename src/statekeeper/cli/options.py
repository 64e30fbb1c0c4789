"""Options shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from statekeeper.interop.diff import WRAPPER_PREFIXES

__all__ = ["out_option", "out_step_option", "prefixes", "strip_options"]

F = TypeVar("F", bound=Callable[..., Any])


def strip_options(command: F) -> F:
    """``--strip-prefix`` (the wrapper prefixes) and ``--strip PREFIX`` (repeatable)."""
    command = click.option(
        "--strip",
        "strip",
        multiple=True,
        metavar="PREFIX",
        help="Strip this prefix from every key (repeatable).",
    )(command)
    return click.option(
        "--strip-prefix",
        "strip_wrappers",
        is_flag=True,
        help="Strip the wrapper prefixes module. and _orig_mod. from every key.",
    )(command)


def out_option(metavar: str, what: str) -> Callable[[F], F]:
    """``-o/--out OUT`` (required): where every command that writes (``average``,
    ``convert``, ``export``) writes; ``what`` says what OUT is."""
    return click.option("-o", "--out", "out", metavar=metavar, required=True, help=what)


def out_step_option(default: str) -> Callable[[F], F]:
    """``--out-step N``: the step number written (``--step`` always selects an input step);
    ``default`` says what it is when not given."""
    return click.option(
        "--out-step",
        type=click.IntRange(min=0),
        help=f"Step number of the statekeeper step written (default: {default}).",
    )


def prefixes(strip_wrappers: bool, strip: tuple[str, ...]) -> tuple[str, ...]:
    """The prefixes the two options ask to strip, wrapper prefixes first."""
    return (*(WRAPPER_PREFIXES if strip_wrappers else ()), *strip)
