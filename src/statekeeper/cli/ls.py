"""``statekeeper ls``: the committed steps of a run directory and its interrupted saves."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from statekeeper.catalog.detect import foreign_format
from statekeeper.catalog.frameworks import framework_folder
from statekeeper.catalog.info import CheckpointInfo
from statekeeper.catalog.listing import list_checkpoints, list_partial, list_set_aside
from statekeeper.catalog.naming import EntryKind, ParsedEntry
from statekeeper.cli import render, render_interop
from statekeeper.format.manifest import MANIFEST
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
        "library": dict(info.library),
        "origin": dict(info.origin),
        "error": info.error,
    }


def listing_json(
    directory: str,
    infos: list[CheckpointInfo],
    partial: list[ParsedEntry],
    tiers: dict[int, list[str]] | None = None,
) -> dict[str, Any]:
    def row(info: CheckpointInfo) -> dict[str, Any]:
        out = _info_json(info)
        if tiers is not None:
            out["tiers"] = tiers.get(info.step, [])
        return out

    def entry(p: ParsedEntry) -> dict[str, Any]:
        return {"name": p.name, "step": p.step, "kind": str(p.kind)}

    return {
        "directory": directory,
        "checkpoints": [row(info) for info in infos],
        "partial": [entry(p) for p in partial if p.kind is not EntryKind.DAMAGED],
        "set_aside": [entry(p) for p in partial if p.kind is EntryKind.DAMAGED],
    }


@click.command("ls")
@click.argument("target", metavar="DIR|URL")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--mirror",
    metavar="URL",
    help="The run's mirror tier (Checkpointer(mirror=...)): show which tiers hold each step.",
)
def ls(target: str, as_json: bool, mirror: str | None) -> None:
    """List the checkpoints of the run directory DIR (or the files of a foreign checkpoint).

    DIR may be an fsspec URL (s3://bucket/run, memory://run), or a folder of framework
    checkpoints: a Lightning ModelCheckpoint directory (*.ckpt), a transformers Trainer
    output directory (checkpoint-N), an Accelerate project directory (checkpoints/).

    Shows every committed step (size, what its save wrote, files, metrics; damaged manifests
    flagged; a step whose committed copy an interrupted overwrite set aside, under that
    name), every entry left by an interrupted save, overwrite or removal, which statekeeper
    never reads, and the damaged steps a restarted run set aside (kept as evidence). With
    --mirror, the steps of both tiers and where each one is.
    """
    with render.reported_errors():
        folder = framework_folder(target)
    if folder is not None:  # Lightning, Trainer or Accelerate checkpoints, one per entry
        from statekeeper.cli.frameworks import list_framework_folder

        if mirror is not None:
            render.fail(
                f"{target} is a {folder.framework} folder, not a statekeeper run directory: "
                "--mirror applies to a run directory (drop --mirror)",
                2,
            )

        list_framework_folder(folder, as_json, listing_json)
        return
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
            infos = list_checkpoints(target)
            partial = list_partial(target) + list_set_aside(target)
        _show(target, *_tiers(infos, mirror), partial, as_json)
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
        partial = list_partial(directory) + list_set_aside(directory)
    _show(str(directory), *_tiers(infos, mirror), partial, as_json)


Tiers = dict[int, list[str]]


def _tiers(
    infos: list[CheckpointInfo], mirror: str | None
) -> tuple[list[CheckpointInfo], Tiers | None]:
    """With a mirror: the steps of the local tier and the mirror's (a step on both listed
    once, from the local tier), and which tiers hold each intact step."""
    if mirror is None:
        return infos, None
    tiers: Tiers = {i.step: ["local"] for i in infos if i.error is None}
    if not is_url(mirror) and not Path(mirror).is_dir():
        render.fail(
            f"--mirror {mirror}: no such directory; pass the mirror tier's path or URL (the "
            "target of Checkpointer(mirror=Mirror(...)))",
            2,
        )
    with render.reported_errors():
        remote = list_checkpoints(mirror)
    merged = {i.step: i for i in infos}
    for info in remote:
        if info.error is None:
            tiers.setdefault(info.step, []).append("mirror")
        local = merged.get(info.step)
        if local is None or (local.error is not None and info.error is None):
            merged[info.step] = info  # damaged here, intact there: the intact one shows
    return [merged[s] for s in sorted(merged)], tiers


def _show(
    where: str,
    infos: list[CheckpointInfo],
    tiers: Tiers | None,
    partial: list[ParsedEntry],
    as_json: bool,
) -> None:
    if as_json:
        render.emit_json(listing_json(where, infos, partial, tiers))
    else:
        render.listing(where, infos, partial, tiers)
