"""``statekeeper doctor``: run every hazard rule on a model factory."""

from __future__ import annotations

import click

from statekeeper.cli import render
from statekeeper.doctor.run import run
from statekeeper.doctor.target import load_factory
from statekeeper.errors import StatekeeperError

__all__ = ["doctor"]


@click.command("doctor")
@click.argument("factory", metavar="MODULE:FUNCTION")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a report.")
def doctor(factory: str, as_json: bool) -> None:
    """Diagnose what MODULE:FUNCTION builds: a model, or a dict with model=, optimizer=,
    example_input= and other training-state entries.

    The function is called (the doctor runs your code; it never touches a run directory).
    Exit status: 0 clean, 1 warnings only, 2 errors, 3 the factory could not be loaded or run.
    """
    try:
        report = run(load_factory(factory), spec=factory)
    except StatekeeperError as exc:
        render.error(str(exc))
        raise click.exceptions.Exit(3) from None
    render.doctor_report(report, as_json)
    raise click.exceptions.Exit(report.exit_code)
