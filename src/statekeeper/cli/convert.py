"""``statekeeper convert``: any readable checkpoint into a statekeeper step or one
safetensors file."""

from __future__ import annotations

import click

from statekeeper.cli import render, render_interop
from statekeeper.cli.command import command, respond, shown_default
from statekeeper.interop.convert import convert

__all__ = ["convert_command"]


@command("convert", json="a report")
@click.argument("src", metavar="IN")
@click.argument("dst", metavar="OUT")
@shown_default(
    "--step", click.IntRange(min=0), 0, "Step number of the statekeeper checkpoint written."
)
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
    src: str, dst: str, step: int, key: str | None, overwrite: bool, as_json: bool
) -> None:
    """Convert the checkpoint IN into OUT.

    IN is any format statekeeper reads (torch.save .pt/.pth/.bin, .safetensors, Hugging Face
    folders and indexes, Lightning .ckpt, Accelerate and DCP folders, statekeeper runs). OUT
    ending in .safetensors gets one safetensors file of every tensor (plain values are listed
    as dropped); any other OUT is a run directory that gets step --step. An existing step or
    .safetensors file is never replaced without --overwrite. Exit status: 0 done, 1 unreadable
    or unsafe input or OUT already exists, 2 bad arguments.
    """
    with render.reported_errors(), render.ByteProgress(enabled=not as_json) as bar:
        result = convert(
            src,
            dst,
            step=step,
            key=key,
            overwrite=overwrite,
            progress=bar.phase("reading"),
            write_progress=bar.phase("writing"),
        )
    respond(as_json, result, render_interop.converted)
