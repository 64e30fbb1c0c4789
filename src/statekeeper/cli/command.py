"""The one way a sub-command is declared and answers: ``@command(name, json=...)`` makes the
click command and gives it ``--json`` (always its last option), the option helpers spell the
options several commands share, and :func:`respond` prints the result as JSON or as text.

Errors are rendered by :func:`statekeeper.cli.render.reported_errors` (one red line and an
exit code); a command wraps the library calls it makes in it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from statekeeper.cli.render_json import emit_json

__all__ = ["command", "input_step", "respond", "shown_default"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def command(name: str, *, json: str) -> Callable[[Callable[..., None]], click.Command]:
    """The click command ``name`` with ``--json`` (``as_json``) after its other options;
    ``json`` names what it replaces in the help: "Print JSON instead of {json}."."""

    def make(function: Callable[..., None]) -> click.Command:
        made = click.command(name)(function)
        made.params.append(
            click.Option(["--json", "as_json"], is_flag=True, help=f"Print JSON instead of {json}.")
        )
        return made

    return make


def input_step(help: str) -> Callable[[F], F]:
    """``--step N``: the step of a run directory the command reads (none: the command's
    default)."""
    return click.option("--step", type=click.IntRange(min=0), help=help)


def shown_default(
    name: str, kind: click.ParamType[Any], default: object, help: str
) -> Callable[[F], F]:
    """An option of type ``kind`` whose default the help shows."""
    return click.option(name, type=kind, default=default, show_default=True, help=help)


def respond(
    as_json: bool,
    result: T,
    text: Callable[[T], object],
    json: Callable[[T], object] | None = None,
) -> None:
    """``result`` printed: with ``--json`` as JSON (``json(result)`` when given, else
    ``result``; a dataclass becomes a dict of its fields), otherwise by ``text``."""
    if as_json:
        emit_json(result if json is None else json(result))
    else:
        text(result)
