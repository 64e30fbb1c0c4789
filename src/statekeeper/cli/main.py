"""The ``statekeeper`` command: a click group with one sub-command per module."""

from __future__ import annotations

import click

from statekeeper import __version__
from statekeeper.cli.average import average
from statekeeper.cli.convert import convert_command
from statekeeper.cli.diff import diff_command
from statekeeper.cli.doctor import doctor
from statekeeper.cli.export import export_command
from statekeeper.cli.inspect import inspect
from statekeeper.cli.ls import ls
from statekeeper.cli.verify import verify

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="statekeeper")
def main() -> None:
    """Inspect, verify, compare and convert checkpoints.

    Every command takes --json for output that programs can read.
    """


main.add_command(ls)
main.add_command(inspect)
main.add_command(verify)
main.add_command(average)
main.add_command(doctor)
main.add_command(diff_command)
main.add_command(convert_command)
main.add_command(export_command)
