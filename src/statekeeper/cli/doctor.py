"""``statekeeper doctor``: run every hazard rule on a model or training state."""

from __future__ import annotations

import click

from statekeeper.cli import render
from statekeeper.doctor.rules import RULES
from statekeeper.doctor.run import diagnose, load_factory

__all__ = ["doctor"]


@click.command("doctor")
@click.argument("factory", metavar="MODULE:FUNCTION")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a report.")
def doctor(factory: str, as_json: bool) -> None:
    """Diagnose what MODULE:FUNCTION builds: an nn.Module or a training state (name -> object).

    The function is called (the doctor runs your code, never touches your run directory).
    Exit status: 0 no finding, 1 findings, 2 the factory could not be loaded or called.
    """
    with render.reported_errors():
        findings = diagnose(load_factory(factory))
    render.doctor_report(factory, [(r.id, r.summary) for r in RULES], findings, as_json)
    raise click.exceptions.Exit(1 if findings else 0)
