"""Listing a run directory and cleaning up interrupted saves."""

from __future__ import annotations

import warnings

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.catalog.journal import JOURNAL
from statekeeper.catalog.location import (
    Location,
    PathOrStorage,
    classify,
    committed,
    resolve_storage,
    set_aside_entries,
)
from statekeeper.catalog.manifests import read_manifest
from statekeeper.catalog.naming import ParsedEntry, parse_entry
from statekeeper.catalog.paths import writer_lock
from statekeeper.errors import StatekeeperError, StatekeeperWarning, user_stacklevel
from statekeeper.format.manifest import MANIFEST
from statekeeper.storage.base import Storage
from statekeeper.storage.lock import LOCK_FILE

__all__ = [
    "clean_up",
    "list_checkpoints",
    "list_partial",
    "list_set_aside",
    "remove_partial",
    "warn_if_foreign",
]


def list_checkpoints(directory: PathOrStorage) -> list[CheckpointInfo]:
    """Committed steps, oldest first. A step whose manifest is damaged has ``error`` set (one
    bad step never fails the listing); a step deleted while it is listed is left out.

    A step renamed while it is listed (the writer's recovery putting a set-aside copy back
    as ``step_N``) is found again under its new name; where a step vanished, the run is
    listed once more, so that a step renamed between two looks is not left out.

    Args:
        directory: The run directory: a path, a URL or a :class:`Storage`.

    Returns:
        One :class:`CheckpointInfo` per committed step, oldest first (a damaged one with
        ``error`` set).

    Raises:
        StorageError: The storage cannot be listed.
    """
    storage = resolve_storage(directory)
    infos: dict[int, CheckpointInfo] = {}
    for _ in range(2):
        vanished = False
        for parsed in committed(storage):
            if parsed.step not in infos:
                info = _listed(storage, parsed)
                vanished |= info is None
                if info is not None:
                    infos[parsed.step] = info
        if not vanished:
            break
    return [infos[step] for step in sorted(infos)]


def _listed(storage: Storage, parsed: ParsedEntry) -> CheckpointInfo | None:
    """One committed step's info (``error`` set when it is damaged); None when it is gone."""
    location = Location(storage, parsed.name, parsed.step)
    try:
        manifest = read_manifest(location)
        try:
            size = storage.size(location.entry, MANIFEST)
        except FileNotFoundError:  # renamed since its manifest was read
            if not location.relocate():
                raise
            size = storage.size(location.entry, MANIFEST)
        return CheckpointInfo.from_manifest(location.path(), manifest, size)
    except (StatekeeperError, OSError) as exc:
        if isinstance(exc, FileNotFoundError) and location.gone():
            return None  # deleted since the listing began: no longer a step of the run
        return CheckpointInfo(parsed.step, location.path(), 0, None, error=str(exc))


def list_partial(directory: PathOrStorage) -> list[ParsedEntry]:
    """In-progress or abandoned saves, and copies an overwrite superseded (never read by
    load). A copy an interrupted overwrite set aside while its step has no other copy is
    that step's committed copy, listed by :func:`list_checkpoints`, not here.

    Args:
        directory: The run directory: a path, a URL or a :class:`Storage`.

    Returns:
        The entries (name, step, kind) of the saves that were never committed and of
        superseded copies.

    Raises:
        StorageError: The storage cannot be listed.
    """
    return classify(resolve_storage(directory).entries())[1]


def list_set_aside(directory: PathOrStorage) -> list[ParsedEntry]:
    """Damaged steps a restarted run set aside to save those steps again (``.damaged-``):
    never read, never deleted by statekeeper (evidence: inspect, then delete by hand)."""
    return set_aside_entries(resolve_storage(directory).entries())


def clean_up(storage: Storage) -> list[str]:
    """Under the writer lock: put back each committed step an interrupted overwrite set
    aside (where the storage can), then delete the leftovers :func:`list_partial` lists;
    their names. Never deletes the only copy of a committed step."""
    recover = getattr(storage, "recover", None)
    if callable(recover):
        recover()
    stale = [p.name for p in list_partial(storage)]
    for name in stale:
        storage.remove(name)
    return stale


def remove_partial(directory: PathOrStorage) -> list[str]:
    """Delete abandoned partial directories; returns their names.

    Takes the run directory's writer lock first, so a partial directory that a live writer
    is filling is never touched: with another writer alive this raises WriterConflictError
    (also for a writer of this process through the same storage object: a Checkpointer
    cleans up its run directory itself, in ``restore_latest``).
    A step an interrupted overwrite set aside is put back under its own name first; damaged
    steps a restarted run set aside (``.damaged-``) are kept.

    Args:
        directory: The run directory: a path, a URL or a :class:`Storage`.

    Returns:
        The names of the directories removed.

    Raises:
        WriterConflictError: Another live writer holds the run directory.
        StorageError: The storage failed to list or remove an entry.
    """
    storage = resolve_storage(directory)
    with writer_lock(storage, exclusive=True):  # not through a Checkpointer's own object
        return clean_up(storage)


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
