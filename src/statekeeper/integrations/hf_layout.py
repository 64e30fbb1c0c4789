"""The ``checkpoint-N`` folders of a transformers ``Trainer`` run, made crash-safe.

A Trainer run directory holds one folder per saved step, ``checkpoint-<global step>``,
which the Trainer's ``get_last_checkpoint`` finds by name alone (``^checkpoint-[0-9]+$``).
statekeeper builds each folder under another name, ``checkpoint-N.partial``, and renames it
to ``checkpoint-N`` once everything in it is written and flushed: a folder with the
Trainer's name is always complete, so a kill at any moment never leaves one that a resume
would pick. An older folder that a save replaces is swapped out in one
``renameat2(RENAME_EXCHANGE)`` where the file system has it, else first renamed aside
(``.replaced-<id>``: a kill before the new folder is renamed in leaves step N only there,
and the next ``train()`` puts it back before it resolves ``resume_from_checkpoint``); one
that retention deletes is renamed (``.removing-<id>``) before its files go. Leftovers of an
interrupted save are removed by the next one.

This module knows nothing of the Trainer: ``integrations.transformers`` drives it.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import shutil
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.checkpoint.retention_policies import Retention
from statekeeper.errors import CorruptCheckpointError, StatekeeperWarning, user_stacklevel
from statekeeper.format.checksum import Hasher
from statekeeper.integrations.scoped_wrap import wrapped_while
from statekeeper.storage.commit import exchange, recover
from statekeeper.storage.files import fsync_dir

__all__ = [
    "checkpoints",
    "commit",
    "file_checksums",
    "flush",
    "put_back",
    "remove_leftovers",
    "rotate",
    "safe_removal",
    "set_aside_newer",
    "staging",
    "verify_files",
]

PREFIX = "checkpoint"
_COMMITTED = re.compile(rf"^{PREFIX}-([0-9]+)$")
_LEFTOVER = re.compile(rf"^{PREFIX}-[0-9]+\.(partial|replaced-[0-9a-f]+|removing-[0-9a-f]+)$")
_STEP_ENTRY = re.compile(r"^step_[0-9]+")
_LOCK = ".statekeeper.lock"
_CHUNK = 16 << 20


def staging(run_dir: str | os.PathLike[str], step: int) -> Path:
    """Where the folder of ``step`` is built before its commit."""
    return Path(run_dir) / f"{PREFIX}-{step}.partial"


def _aside(path: Path, kind: str) -> Path:
    target = path.with_name(f"{path.name}.{kind}-{uuid.uuid4().hex[:12]}")
    path.rename(target)
    return target


def commit(built: Path, step: int) -> Path:
    """Rename the folder ``built`` to ``checkpoint-<step>`` beside it (replacing one that
    exists) and make the rename durable. Returns the committed folder."""
    final = built.parent / f"{PREFIX}-{step}"
    if final.exists() and exchange(built, final):  # atomic: checkpoint-<step> always whole
        fsync_dir(final.parent)
        old = built.rename(final.with_name(f"{final.name}.removing-{uuid.uuid4().hex[:12]}"))
        shutil.rmtree(old, ignore_errors=True)  # the old copy, now under the built name
        return final
    replaced = _aside(final, "replaced") if final.exists() else None
    built.rename(final)
    fsync_dir(final.parent)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return final


_REMOVING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "statekeeper_safe_removal", default=False
)


class _SetAside:
    """``shutil`` for a module that deletes ``checkpoint-N`` folders in place: inside
    :func:`safe_removal` (in that thread or task alone), its ``rmtree`` renames a committed
    folder aside first; everything else is ``shutil``'s."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def rmtree(self, path: Any, *args: Any, **kwargs: Any) -> None:
        target = path
        if _REMOVING.get() and isinstance(path, str | os.PathLike):
            folder = Path(path)
            if _COMMITTED.match(folder.name) and folder.is_dir():
                try:
                    target = _aside(folder, "removing")
                except OSError:
                    if not kwargs.get("ignore_errors"):
                        raise
        self._real.rmtree(target, *args, **kwargs)


@contextlib.contextmanager
def safe_removal(module: Any) -> Iterator[None]:
    """While inside (in this thread or task), ``module.shutil.rmtree`` of a committed
    folder renames it aside before deleting it. The wrapper is installed once, and acts
    only where this context is active: other threads, and other code, see ``shutil``."""
    with wrapped_while(module, "shutil", _SetAside, _REMOVING, True):
        yield


_ABANDONED = "abandoned"  # outside the checkpoint-* names that the Trainer globs and prunes


def set_aside_newer(run_dir: str | os.PathLike[str], step: int) -> list[Path]:
    """Rename the committed folders of steps past ``step`` to
    ``abandoned.checkpoint-N.<id>``: left by a run this one rolled back from (or an older
    run in the same folder), they would otherwise be what a resume picks. Kept, never
    deleted (the Trainer's own pruning looks at ``checkpoint-*`` names only). Returns the
    new paths."""
    moved = []
    for found, path in checkpoints(run_dir).items():
        if found > step:
            target = path.with_name(f"{_ABANDONED}.{path.name}.{uuid.uuid4().hex[:12]}")
            path.rename(target)
            moved.append(target)
    return moved


def checkpoints(run_dir: str | os.PathLike[str]) -> dict[int, Path]:
    """The committed ``checkpoint-N`` folders of ``run_dir`` by step."""
    found: dict[int, Path] = {}
    root = Path(run_dir)
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        match = _COMMITTED.match(entry.name)
        if match and entry.is_dir():
            found[int(match.group(1))] = entry
    return dict(sorted(found.items()))


def put_back(run_dir: str | os.PathLike[str]) -> list[str]:
    """Rename each folder an interrupted overwrite set aside (``checkpoint-N.replaced-<id>``
    where no ``checkpoint-N`` exists: that step's committed copy) back to its name, with the
    run directory's own recovery (:func:`statekeeper.storage.commit.recover`); the names
    restored. Before the Trainer looks for the newest ``checkpoint-N`` (by name only), and
    before each save's clean-up."""
    root = Path(run_dir)
    return recover(root) if root.is_dir() else []


def remove_leftovers(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Delete what interrupted saves and deletions left in ``run_dir``; returns it. A folder
    an interrupted overwrite set aside, whose step has no other folder, is put back first."""
    root = Path(run_dir)
    put_back(root)
    gone = [e for e in root.iterdir() if _LEFTOVER.match(e.name)] if root.is_dir() else []
    for entry in gone:
        shutil.rmtree(entry, ignore_errors=True)
    return gone


def rotate(
    run_dir: str | os.PathLike[str], keep: Retention, protect: Iterable[str | os.PathLike[str]]
) -> list[int]:
    """Delete the committed folders that ``keep`` does not keep, ranked by step number (never
    by modification time); the newest folder and those in ``protect`` always stay. Returns
    the steps deleted; a folder that cannot be removed is warned about and stays (never a
    failure of the save that committed the newest one)."""
    found = checkpoints(run_dir)
    if not found:
        return []
    infos = [CheckpointInfo(step=s, path=str(p), bytes=0, created=None) for s, p in found.items()]
    protected = {Path(p).resolve() for p in protect}
    kept = keep.keep(infos) | {max(found)}
    deleted = []
    for step, path in found.items():
        if step in kept or path.resolve() in protected:
            continue
        try:
            doomed = _aside(path, "removing")
        except OSError as exc:  # the new folder is committed: this save must not fail
            warnings.warn(
                f"statekeeper: retention could not remove {path} ({exc.strerror or exc}); "
                "the checkpoint just saved is committed, and the removal is tried again at "
                "the next save. Make the folder removable (an immutable attribute, a mount "
                "on it) or delete it by hand",
                StatekeeperWarning,
                stacklevel=user_stacklevel(),
            )
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(step)
    return deleted


def _digest(path: Path) -> str:
    hasher = Hasher()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def flush(folder: Path, names: Iterable[str]) -> None:
    """Flush the files ``names`` (relative to ``folder``) and their folders to stable
    storage: the framework wrote them without, and the commit's rename must never publish
    a folder whose files a power cut could lose."""
    folders = {folder}
    for name in names:
        path = folder / name
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        folders.add(path.parent)
    for each in folders:
        fsync_dir(each)


def file_checksums(folder: Path) -> dict[str, str]:
    """The checksum of every file under ``folder`` that is not statekeeper's own (its step
    folders and writer lock), by path relative to ``folder`` with ``/`` separators."""
    sums: dict[str, str] = {}
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        if here == folder:
            dirs[:] = [d for d in dirs if not _STEP_ENTRY.match(d)]
        for name in files:
            if here == folder and name == _LOCK:
                continue
            path = here / name
            sums[path.relative_to(folder).as_posix()] = _digest(path)
    return dict(sorted(sums.items()))


def verify_files(folder: Path, expected: Mapping[str, str]) -> None:
    """Raise ``CorruptCheckpointError`` unless every file in ``expected`` is in ``folder``
    with the recorded checksum (every file is checked before the error is raised)."""
    problems = []
    for name, digest in expected.items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif _digest(path) != digest:
            problems.append(f"{name} does not match the checksum recorded when it was saved")
    if problems:
        raise CorruptCheckpointError(
            str(folder),
            f"{'; '.join(problems)} (it was changed or damaged after its save; resume from "
            "another checkpoint-N by passing resume_from_checkpoint=<its path>)",
        )
