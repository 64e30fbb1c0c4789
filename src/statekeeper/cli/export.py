"""``statekeeper export``: the inference weights of a checkpoint as one safetensors file."""

from __future__ import annotations

import click

from statekeeper.cli import render, render_interop
from statekeeper.cli.command import command, respond
from statekeeper.cli.options import out_option, prefixes, strip_options
from statekeeper.interop.export import DTYPES, export

__all__ = ["export_command"]


@command("export", json="a report")
@click.argument("ckpt", metavar="CKPT")
@out_option("OUT.safetensors", "The safetensors file to write.")
@click.option("--key", help="Entry holding the model weights (default: detected).")
@click.option(
    "--dtype",
    type=click.Choice(sorted(DTYPES), case_sensitive=False),
    help="Cast floating tensors to this dtype.",
)
@strip_options
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
def export_command(
    ckpt: str, out: str, key: str | None, dtype: str | None, strip_wrappers: bool,
    strip: tuple[str, ...], overwrite: bool, as_json: bool,
) -> None:  # fmt: skip
    """Write the weights needed for inference from CKPT to OUT.safetensors.

    Only the model's state_dict goes out (no optimizer, RNG, counters or other values).
    Tied weights are stored once and recorded under "aliases" in the file's metadata;
    statekeeper.read(OUT) expands them. An existing OUT is replaced only with --overwrite.
    Exit status: 0 done, 1 unreadable input, 2 bad
    arguments.
    """
    with render.reported_errors():
        if not out.endswith(".safetensors"):
            render.fail(f"{out}: the output must be a .safetensors file", 2)
        with render.ByteProgress(enabled=not as_json) as bar:
            result = export(ckpt, out, key=key, dtype=dtype, strip=prefixes(strip_wrappers, strip),
                            overwrite=overwrite, progress=bar.phase("writing"))  # fmt: skip
    respond(as_json, result, render_interop.exported)
