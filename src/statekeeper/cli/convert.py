"""``statekeeper convert``: any readable checkpoint into a statekeeper step or one
safetensors file."""

from __future__ import annotations

import click

from statekeeper.cli import render, render_interop
from statekeeper.cli.command import command, respond
from statekeeper.cli.options import out_option, out_step_option
from statekeeper.interop.convert import convert

__all__ = ["convert_command"]


@command("convert", json="a report")
@click.argument("path", metavar="IN")
@out_option("OUT", "A run directory (path or URL) to save a step into, or a .safetensors file.")
@out_step_option("0")
@click.option(
    "--key",
    help="Statekeeper OUT: save the whole input under this one entry. "
    "Safetensors OUT: write only this entry of the input.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the step if OUT already has it, or the OUT .safetensors file if it exists.",
)
def convert_command(
    path: str, out: str, out_step: int | None, key: str | None, overwrite: bool, as_json: bool
) -> None:
    """Convert the checkpoint IN into OUT.

    IN is any format statekeeper reads (torch.save .pt/.pth/.bin, .safetensors, Hugging Face
    folders and indexes, Lightning .ckpt, Accelerate and DCP folders, statekeeper runs). OUT
    ending in .safetensors gets one safetensors file of every tensor (plain values are listed
    as dropped); any other OUT is a run directory that gets step --out-step. An existing step or
    .safetensors file is never replaced without --overwrite. Exit status: 0 done, 1 unreadable
    or unsafe input or OUT already exists, 2 bad arguments.
    """
    with render.reported_errors(), render.ByteProgress(enabled=not as_json) as bar:
        result = convert(
            path,
            out,
            out_step=0 if out_step is None else out_step,
            key=key,
            overwrite=overwrite,
            progress=bar.phase("reading"),
            write_progress=bar.phase("writing"),
        )
    respond(as_json, result, render_interop.converted)
