"""The ``statekeeper`` command: a click group with one sub-command per module.

Sub-commands are imported when they run, not when the group starts: ``statekeeper ls`` of a
run needs neither torch nor the doctor, and starts in a fraction of a second.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from statekeeper._version import __version__

__all__ = ["main"]

COMMANDS = {
    "ls": ("statekeeper.cli.ls", "ls"),
    "inspect": ("statekeeper.cli.inspect", "inspect"),
    "verify": ("statekeeper.cli.verify", "verify"),
    "average": ("statekeeper.cli.average", "average"),
    "doctor": ("statekeeper.cli.doctor", "doctor"),
    "diff": ("statekeeper.cli.diff", "diff_command"),
    "convert": ("statekeeper.cli.convert", "convert_command"),
    "export": ("statekeeper.cli.export", "export_command"),
}
"""Command name -> (module, attribute); a new command is one line here."""

_HELP = {
    "ls": "List the checkpoints of a run directory (or the files of a foreign checkpoint).",
    "inspect": "Show what a checkpoint holds: entries, tensors, values, files.",
    "verify": "Verify every byte of a step, or of every step of a run.",
    "average": "Average the weights of several checkpoints into a new step.",
    "doctor": "Diagnose a model factory or a checkpoint for checkpoint hazards.",
    "diff": "Compare two checkpoints, in any formats statekeeper reads.",
    "convert": "Convert a checkpoint into another format.",
    "export": "Write the weights needed for inference to a safetensors file.",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        found = COMMANDS.get(name)
        if found is None:
            return None
        command: Any = getattr(importlib.import_module(found[0]), found[1])
        return command  # type: ignore[no-any-return]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The list in ``--help`` without importing every command."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, _HELP[name]) for name in sorted(COMMANDS)])


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="statekeeper")
def main() -> None:
    """Inspect, verify, compare and convert checkpoints.

    Every command takes --json for output that programs can read.
    """


if __name__ == "__main__":
    main()
