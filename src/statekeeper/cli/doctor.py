"""``statekeeper doctor``: run every hazard rule on a model factory."""

from __future__ import annotations

from pathlib import Path

import click

from statekeeper.cli import render, render_doctor
from statekeeper.doctor.checkpoint_rules import check_checkpoint
from statekeeper.doctor.run import run
from statekeeper.doctor.target import load_factory
from statekeeper.errors import InvalidArgumentError, StatekeeperError

__all__ = ["doctor"]


@click.command("doctor")
@click.argument("target", metavar="MODULE:FUNCTION|CKPT")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a report.")
@click.option(
    "--fix-transient",
    is_flag=True,
    help="Print the declarations that let statekeeper.clearing.clear_state free the transient "
    "tensors and per-batch buffers found (SK004, SK005), and the call to make.",
)
def doctor(target: str, as_json: bool, fix_transient: bool) -> None:
    """Diagnose what MODULE:FUNCTION builds (a model, or a dict with model=, optimizer=,
    example_input= and other training-state entries), or a checkpoint file or directory.

    The function is called (the doctor runs your code; it never writes to a run directory);
    a checkpoint is only read, and a pickle file is never unpickled.
    Exit status: 0 clean, 1 warnings only, 2 errors, 3 the target could not be loaded.
    With --fix-transient (a factory only): 0 nothing to add, 1 declarations to add, 3 the
    model could not be checked (no example input, or the factory returns the same model).
    """
    if fix_transient:
        _fix_transient(target, as_json)
    try:
        if Path(target).exists():
            report = check_checkpoint(target)
        else:
            report = run(load_factory(target), spec=target)
    except StatekeeperError as exc:
        render.error(str(exc))
        raise click.exceptions.Exit(3) from None
    render_doctor.doctor_report(report, as_json)
    raise click.exceptions.Exit(report.exit_code)


def _fix_transient(target: str, as_json: bool) -> None:
    from statekeeper.doctor.transient_fix import fix_transient

    try:
        if Path(target).exists():
            raise InvalidArgumentError(
                f"--fix-transient reads a model, not a checkpoint: {target!r} is a path; "
                "name the factory that builds the model (module:function)"
            )
        fix = fix_transient(load_factory(target), spec=target)
    except StatekeeperError as exc:
        render.error(str(exc))
        raise click.exceptions.Exit(3) from None
    render_doctor.transient_fix(fix, as_json)
    raise click.exceptions.Exit(3 if not fix.checked else 1 if fix.code() else 0)
