"""``statekeeper average``: the (weighted) mean of several checkpoints, saved as a new step."""

from __future__ import annotations

from pathlib import Path

import click

from statekeeper.averaging.offline import average_checkpoints, normalize_weights
from statekeeper.checkpoint.location import locate
from statekeeper.cli import render
from statekeeper.errors import InvalidArgumentError
from statekeeper.storage.urls import is_url

__all__ = ["average", "parse_weights"]


def parse_weights(text: str | None) -> list[float] | None:
    """``"0.2,0.3,0.5"`` -> ``[0.2, 0.3, 0.5]``; None stays None (a uniform mean)."""
    if text is None:
        return None
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise InvalidArgumentError(
            f"--weights {text!r}: expected comma-separated numbers, one per CKPT, "
            "such as 0.2,0.3,0.5"
        ) from None


@click.command("average")
@click.argument("ckpts", metavar="CKPT...", nargs=-1, required=True)
@click.option(
    "-o",
    "--out",
    required=True,
    help="Run directory (path or URL) to save the average into (as a new step).",
)
@click.option(
    "--weights",
    metavar="W1,W2,...",
    help="One weight per CKPT, comma-separated (normalized to sum 1). Default: uniform.",
)
@click.option("--key", help="Average only this top-level entry (e.g. model); save just it.")
@click.option(
    "--step", type=click.IntRange(min=0), help="Step of the output (default: the newest input's)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a report.")
def average(
    ckpts: tuple[str, ...],
    out: str,
    weights: str | None,
    key: str | None,
    step: int | None,
    as_json: bool,
) -> None:
    """Average the weights of the checkpoints CKPT... into a new step of the run OUT.

    Each CKPT is a step directory or a run directory (its newest step). Floating tensors are
    averaged in float64 and keep their dtype; integer tensors and other values come from
    the newest input. Exit status: 0 done, 1 the checkpoints do not match or are damaged,
    2 bad arguments or nothing found.
    """
    tensors = 0

    def count(done: int, total: int) -> None:
        nonlocal tensors
        tensors = total
        if update is not None:
            update(done, total)

    with render.reported_errors():
        for ckpt in ckpts:
            if not is_url(ckpt) and not Path(ckpt).is_dir():
                render.fail(f"{ckpt} is not a directory; pass step or run directories", 2)
        raw = parse_weights(weights)
        normalized = normalize_weights(raw, len(ckpts))
        inputs = [locate(ckpt, None).path() for ckpt in ckpts]  # before OUT may gain a step
        with render.ByteProgress(enabled=not as_json, counts=True) as bar:
            update = bar.phase("averaging tensors")
            info = average_checkpoints(ckpts, out, weights=raw, key=key, step=step, progress=count)
    summary = {
        "out": info.path,
        "step": info.step,
        "inputs": inputs,
        "weights": normalized,
        "tensors": tensors,
        "bytes": info.bytes,
    }
    if as_json:
        render.emit_json(summary)
    else:
        render.averaged(summary)
