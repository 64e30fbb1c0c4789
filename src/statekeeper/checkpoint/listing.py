"""Listing a run directory and cleaning up interrupted saves."""

from __future__ import annotations

import warnings

from statekeeper.checkpoint.info import CheckpointInfo
from statekeeper.checkpoint.journal import JOURNAL
from statekeeper.checkpoint.location import Location, PathOrStorage, committed, resolve_storage
from statekeeper.checkpoint.manifests import read_manifest
from statekeeper.checkpoint.naming import EntryKind, ParsedEntry, parse_entry
from statekeeper.errors import StatekeeperError, StatekeeperWarning, user_stacklevel
from statekeeper.format.manifest import MANIFEST
from statekeeper.storage.base import Storage
from statekeeper.storage.lock import LOCK_FILE

__all__ = ["list_checkpoints", "list_partial", "remove_partial", "warn_if_foreign"]


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


def warn_if_foreign(storage: Storage) -> None:
    """Starting from scratch in a directory that holds other things is worth a word: it
    is most often the wrong directory (another tool's checkpoints)."""
    try:
        names = [*storage.entries(), *storage.files("")]
    except (OSError, StatekeeperError):
        return
    other = sorted(n for n in names if n not in (LOCK_FILE, JOURNAL) and parse_entry(n) is None)
    if other:
        shown = ", ".join(other[:5]) + (", ..." if len(other) > 5 else "")
        warnings.warn(
            f"statekeeper: {storage.describe()} holds no statekeeper step but "
            f"{len(other)} other entr{'y' if len(other) == 1 else 'ies'} ({shown}); "
            "starting from scratch. If that is another tool's checkpoint folder, pass the "
            "run directory statekeeper saves into (to start from a foreign checkpoint, "
            "load statekeeper.read(path) into the model first).",
            StatekeeperWarning,
            stacklevel=user_stacklevel(),
        )
