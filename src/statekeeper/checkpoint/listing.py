"""Listing a run directory and cleaning up interrupted saves."""

from __future__ import annotations

from statekeeper.checkpoint.info import CheckpointInfo
from statekeeper.checkpoint.location import Location, PathOrStorage, committed, resolve_storage
from statekeeper.checkpoint.manifests import read_manifest
from statekeeper.checkpoint.naming import EntryKind, ParsedEntry, parse_entry
from statekeeper.errors import StatekeeperError
from statekeeper.format.manifest import MANIFEST

__all__ = ["list_checkpoints", "list_partial", "remove_partial"]


def list_checkpoints(directory: PathOrStorage) -> list[CheckpointInfo]:
    """Committed steps, oldest first. A step whose manifest is damaged has ``error`` set (one
    bad step never fails the listing); a step deleted while it is listed is left out."""
    storage = resolve_storage(directory)
    infos = []
    for parsed in committed(storage):
        location = Location(storage, parsed.name, parsed.step)
        try:
            manifest = read_manifest(location)
            size = storage.size(parsed.name, MANIFEST)
            infos.append(CheckpointInfo.from_manifest(location.path(), manifest, size))
        except (StatekeeperError, OSError) as exc:
            if isinstance(exc, FileNotFoundError) and location.gone():
                continue  # deleted since the listing began: no longer a step of the run
            infos.append(CheckpointInfo(parsed.step, location.path(), 0, None, error=str(exc)))
    return infos


def list_partial(directory: PathOrStorage) -> list[ParsedEntry]:
    """In-progress or abandoned saves (never read by load)."""
    storage = resolve_storage(directory)
    parsed = (parse_entry(e) for e in storage.entries())
    return [p for p in parsed if p is not None and p.kind is not EntryKind.COMMITTED]


def remove_partial(directory: PathOrStorage) -> list[str]:
    """Delete abandoned partial directories; returns their names.

    Takes the run directory's writer lock first, so a partial directory that a live writer
    is filling is never touched: with another writer alive this raises WriterConflictError.
    """
    storage = resolve_storage(directory)
    with storage.writer_lock():
        stale = [p.name for p in list_partial(storage)]
        for name in stale:
            storage.remove(name)
    return stale
