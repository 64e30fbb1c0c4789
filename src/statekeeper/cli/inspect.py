"""``statekeeper inspect``: what a checkpoint holds (parsing and rendering only; the report
comes from :func:`statekeeper.interop.inspection.inspect`)."""

from __future__ import annotations

import click

from statekeeper.catalog.inspection import InspectReport
from statekeeper.cli import render, render_inspect, render_interop
from statekeeper.cli.command import command, input_step
from statekeeper.interop.inspection import inspect as inspect_checkpoint

__all__ = ["inspect"]


@command("inspect", json="tables")
@click.argument("target", metavar="CKPT|URL")
@input_step("Step of a run directory (default: newest).")
def inspect(target: str, step: int | None, as_json: bool) -> None:
    """Show the state tree of a checkpoint: tensors, values, aliases, metrics.

    CKPT is a step directory or a run directory. Only the manifest is read (and verified);
    use `statekeeper verify` to check the tensor data too. CKPT may be an fsspec URL
    (s3://bucket/run/step_000000100). A checkpoint of another format
    (torch.save, safetensors, Hugging Face, Lightning, Accelerate, DCP) is read safely and
    its tensors and values are shown.
    """
    with render.reported_errors():
        report = inspect_checkpoint(target, step=step)
    if as_json:
        render.emit_json(report if isinstance(report, InspectReport) else report.to_json())
    elif isinstance(report, InspectReport):
        render_inspect.inspection(report)
    else:
        render_interop.foreign_inspection(report)
