"""``statekeeper diff``: compare two checkpoints of any readable formats."""

from __future__ import annotations

import click

from statekeeper.cli import render, render_interop
from statekeeper.cli.command import command, respond, shown_default
from statekeeper.cli.options import prefixes, strip_options
from statekeeper.interop.diff import diff
from statekeeper.interop.tied import TiedKeys

__all__ = ["diff_command"]

_TOLERANCE = click.FloatRange(min=0)


@command("diff", json="tables")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@shown_default(
    "--atol", _TOLERANCE, 0.0, "Absolute tolerance: equal when |a-b| <= atol + rtol*|b|."
)
@shown_default("--rtol", _TOLERANCE, 0.0, "Relative tolerance (see --atol).")
@click.option("--key", help="Compare only this entry (e.g. model) of each side that has it.")
@strip_options
@shown_default("--show", click.IntRange(min=1), 50, "Rows shown per section (--json lists all).")
@shown_default(
    "--tied",
    click.Choice([t.value for t in TiedKeys]),
    TiedKeys.AUTO.value,
    "A key one side omits because it is tied to another: match it through its twin "
    "(auto: for Hugging Face folders and safetensors files), or require it (strict).",
)
def diff_command(
    a: str, b: str, atol: float, rtol: float, key: str | None, strip_wrappers: bool,
    strip: tuple[str, ...], show: int, tied: str, as_json: bool,
) -> None:  # fmt: skip
    """Compare the checkpoints A and B, in any formats statekeeper reads.

    Lists keys only in A or only in B, shape/dtype/type/value changes, and the tensors that
    differ with their largest absolute and relative difference (largest first). Keys are
    paths joined with '.' (model.fc.weight). Exit status: 0 equal, 1 different (or an
    error), 2 bad arguments or nothing found.
    """
    with render.reported_errors(), render.ByteProgress(enabled=not as_json, counts=True) as bar:
        result = diff(a, b, atol=atol, rtol=rtol, key=key, strip=prefixes(strip_wrappers, strip),
                      tied=TiedKeys(tied), progress=bar.phase("comparing tensors"))  # fmt: skip
    respond(as_json, result, lambda r: render_interop.diff_report(r, show), lambda r: r.to_json())
    raise click.exceptions.Exit(0 if result.equal else 1)
