"""``statekeeper doctor``: run every hazard rule on a model factory."""

from __future__ import annotations

from pathlib import Path

import click

from statekeeper.cli import render
from statekeeper.doctor.checkpoint_rules import check_checkpoint
from statekeeper.doctor.run import run
from statekeeper.doctor.target import load_factory
from statekeeper.errors import StatekeeperError

__all__ = ["doctor"]


@click.command("doctor")
@click.argument("target", metavar="MODULE:FUNCTION|CKPT")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a report.")
def doctor(target: str, as_json: bool) -> None:
    """Diagnose what MODULE:FUNCTION builds (a model, or a dict with model=, optimizer=,
    example_input= and other training-state entries), or a checkpoint file or directory.

    The function is called (the doctor runs your code; it never writes to a run directory);
    a checkpoint is only read, and a pickle file is never unpickled.
    Exit status: 0 clean, 1 warnings only, 2 errors, 3 the target could not be loaded.
    """
    try:
        if Path(target).exists():
            report = check_checkpoint(target)
        else:
            report = run(load_factory(target), spec=target)
    except StatekeeperError as exc:
        render.error(str(exc))
        raise click.exceptions.Exit(3) from None
    render.doctor_report(report, as_json)
    raise click.exceptions.Exit(report.exit_code)
