"""``statekeeper verify``: check every byte of one step or of every step of a run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import click

from statekeeper.checkpoint.location import Location, committed, locate, resolve_storage
from statekeeper.checkpoint.manifests import read_manifest
from statekeeper.checkpoint.naming import EntryKind, parse_entry
from statekeeper.checkpoint.verify import verify_step
from statekeeper.cli import render
from statekeeper.errors import InvalidArgumentError, StatekeeperError
from statekeeper.format.manifest import MANIFEST
from statekeeper.interop.detect import foreign_format
from statekeeper.storage.local import LocalStorage
from statekeeper.storage.urls import is_url

__all__ = ["StepResult", "targets", "verify", "verify_location"]


@dataclass(frozen=True)
class StepResult:
    step: int | None  # None when neither the directory name nor the manifest tells
    path: str
    ok: bool
    error: str | None
    bytes: int  # the step's size according to its manifest (0 when that is unreadable)


def targets(target: str, step: int | None) -> list[Location]:
    """The committed steps to verify: ``target`` itself if it is a step directory, else its
    steps. ``target`` is a path or a URL (``s3://bucket/run``, ``memory://run/step_000000100``).

    A directory named like a committed step counts as one even when its manifest is gone, so
    that the damage is reported rather than mistaken for an empty run.
    """
    if is_url(target):
        last = parse_entry(target.rstrip("/").rpartition("/")[2])
        if step is not None or (last is not None and last.kind is EntryKind.COMMITTED):
            return [locate(target, step)]
        storage = resolve_storage(target)
        steps = committed(storage)
        if not steps:
            return [locate(target, None)]
        return [Location(storage, p.name, p.step) for p in steps]
    path = Path(target)
    has_manifest = (path / MANIFEST).is_file()
    parsed = parse_entry(path.resolve().name)
    if not has_manifest and parsed is not None and parsed.kind is EntryKind.COMMITTED:
        if step is not None and step != parsed.step:
            raise InvalidArgumentError(f"{path} is step {parsed.step}; do not pass --step {step}")
        resolved = path.resolve()
        return [Location(LocalStorage(resolved.parent), resolved.name, parsed.step)]
    if has_manifest or step is not None:
        return [locate(path, step)]
    storage = LocalStorage(path)
    steps = committed(storage)
    if not steps:
        return [locate(path, None)]  # raises StepNotFoundError with the fix
    return [Location(storage, p.name, p.step) for p in steps]


def verify_location(location: Location, bar: render.ByteProgress) -> StepResult:
    """Checksums and sizes of every file, then every header and record checked against the
    manifest (:func:`~statekeeper.checkpoint.verify.verify_step`: no tensor is built)."""
    step = location.step if location.step >= 0 else None
    size = 0
    try:
        manifest = read_manifest(location)
        step = manifest.step
        data = sum(record.size for record in manifest.files.values())
        size = data + location.storage.size(location.entry, MANIFEST)
        verify_step(location, bar.phase(f"step {step}", data))  # checksums, then every record
    except (StatekeeperError, OSError) as exc:
        return StepResult(step, location.path(), False, str(exc), size)
    return StepResult(step, location.path(), True, None, size)


@click.command("verify")
@click.argument("path", metavar="CKPT|DIR|URL")
@click.option(
    "--step", type=click.IntRange(min=0), help="Verify only this step of a run directory."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a report.")
def verify(path: str, step: int | None, as_json: bool) -> None:
    """Verify a step directory, or every committed step of a run directory (paths or fsspec
    URLs such as s3://bucket/run).

    Every file's size and checksum is checked and every shard is decoded and compared with
    the manifest. Exit status: 0 all good, 1 a step failed, 2 nothing to verify.
    """
    with render.reported_errors():
        foreign = None if is_url(path) else foreign_format(path)
        if foreign is not None:
            render.fail(
                f"{path} is a {foreign[1]} checkpoint, not a statekeeper step: it carries no "
                "checksums to verify. Read it with `statekeeper inspect`, or make a checksummed "
                "statekeeper step of it with `statekeeper convert`",
                2,
            )
        if not is_url(path) and not Path(path).exists():
            render.fail(f"{path} does not exist; pass a run directory or a step directory", 2)
        if not is_url(path) and not Path(path).is_dir():
            render.fail(f"{path} is not a directory; pass a run directory or a step directory", 2)
        locations = targets(path, step)
    results = []
    for location in locations:
        with render.ByteProgress(enabled=not as_json) as bar:
            result = verify_location(location, bar)
        results.append(result)
        if not as_json:
            render.verify_step(result)
    ok = all(result.ok for result in results)
    if as_json:
        render.emit_json({"ok": ok, "steps": [dataclasses.asdict(r) for r in results]})
    else:
        render.verify_summary(results)
    raise click.exceptions.Exit(0 if ok else 1)
