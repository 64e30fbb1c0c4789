"""``statekeeper ls``: the committed steps of a run directory and its interrupted saves."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from statekeeper.checkpoint.info import CheckpointInfo
from statekeeper.checkpoint.listing import list_checkpoints, list_partial
from statekeeper.checkpoint.naming import ParsedEntry
from statekeeper.cli import render, render_interop
from statekeeper.format.manifest import MANIFEST
from statekeeper.interop.detect import foreign_format
from statekeeper.storage.urls import is_url

__all__ = ["listing_json", "ls"]


def _info_json(info: CheckpointInfo) -> dict[str, Any]:
    return {
        "step": info.step,
        "path": info.path,
        "bytes": info.bytes,
        "created": info.created.isoformat() if info.created else None,
        "metrics": dict(info.metrics),
        "files": info.files,
        "written": info.written,
        "reused_files": info.reused_files,
        "error": info.error,
    }


def listing_json(
    directory: str, infos: list[CheckpointInfo], partial: list[ParsedEntry]
) -> dict[str, Any]:
    return {
        "directory": directory,
        "checkpoints": [_info_json(info) for info in infos],
        "partial": [{"name": p.name, "step": p.step, "kind": str(p.kind)} for p in partial],
    }


@click.command("ls")
@click.argument("target", metavar="DIR|URL")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ls(target: str, as_json: bool) -> None:
    """List the checkpoints of the run directory DIR (or the files of a foreign checkpoint).

    DIR may be an fsspec URL (s3://bucket/run, memory://run).

    Shows every committed step (size, files, metrics; damaged manifests flagged) and every
    partial directory left by an interrupted save, which statekeeper never reads.
    """
    with render.reported_errors():
        foreign = foreign_format(target)
        files = []
        if foreign is not None:  # the foreign readers (and torch) only for foreign paths
            from statekeeper.interop.describe import list_files

            files = list_files(*foreign)
    if foreign is not None:
        path, fmt = foreign[0], str(foreign[1])
        if as_json:
            render.emit_json({"path": path, "format": fmt, "files": [asdict(f) for f in files]})
        else:
            render_interop.foreign_listing(path, fmt, files)
        return
    if is_url(target):
        with render.reported_errors():
            infos, partial = list_checkpoints(target), list_partial(target)
        _show(target, infos, partial, as_json)
        return
    directory = Path(target)
    with render.reported_errors():
        if not directory.is_dir():
            render.fail(
                f"{directory} is not a directory; pass the run directory of a training run", 2
            )
        if (directory / MANIFEST).is_file():
            render.fail(
                f"{directory} is a single step, not a run directory; run `statekeeper ls "
                f"{directory.parent}` or `statekeeper inspect {directory}`",
                2,
            )
        infos = list_checkpoints(directory)
        partial = list_partial(directory)
    _show(str(directory), infos, partial, as_json)


def _show(
    where: str, infos: list[CheckpointInfo], partial: list[ParsedEntry], as_json: bool
) -> None:
    if as_json:
        render.emit_json(listing_json(where, infos, partial))
    else:
        render.listing(where, infos, partial)
