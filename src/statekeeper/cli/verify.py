"""``statekeeper verify``: check every byte of one step or of every step of a run (parsing
and rendering only; the checks are :mod:`statekeeper.catalog.verify`'s)."""

from __future__ import annotations

import click

from statekeeper.catalog.frameworks import framework_folder
from statekeeper.catalog.location import Location
from statekeeper.catalog.verification import VerifyReport, verify_location
from statekeeper.catalog.verify import verify_targets
from statekeeper.cli import render
from statekeeper.cli.command import command, input_step, respond

__all__ = ["verify"]


def _label(location: Location) -> str:
    return f"step {location.step}" if location.step >= 0 else location.entry


@command("verify", json="a report")
@click.argument("path", metavar="CKPT|DIR|URL")
@input_step("Verify only this step of a run directory.")
def verify(path: str, step: int | None, as_json: bool) -> None:
    """Verify a step directory, or every committed step of a run directory (paths or fsspec
    URLs such as s3://bucket/run).

    Every file's size and checksum is checked and every shard is decoded and compared with
    the manifest. Exit status: 0 all good, 1 a step failed, 2 nothing to verify.

    A folder of framework checkpoints (Lightning *.ckpt, Trainer checkpoint-N, Accelerate
    checkpoints/) is verified entry by entry: statekeeper steps byte by byte; entries in
    the framework's own format, which carry no checksums, are read in full by the safe
    readers (READ), or REFUSED when only pickle could load them. Exit 1 when one is damaged.
    """
    with render.reported_errors():
        folder = framework_folder(path)
    if folder is not None:  # Lightning, Trainer or Accelerate checkpoints, one per entry
        from statekeeper.cli.frameworks import verify_framework_folder

        verify_framework_folder(folder, step, as_json)
    with render.reported_errors():
        locations = verify_targets(path, step)
    results = []
    for location in locations:  # one step at a time: each line shows as soon as it is known
        with render.ByteProgress(enabled=not as_json) as bar:
            result = verify_location(location, bar.phase(_label(location)))
        results.append(result)
        if not as_json:
            render.verify_step(result)
    report = VerifyReport(tuple(results))
    respond(as_json, report, render.verify_summary)
    raise click.exceptions.Exit(0 if report.ok else 1)
