"""Verifying a folder of framework checkpoints (:mod:`statekeeper.catalog.frameworks`), entry
by entry, as a typed report.

- An entry holding statekeeper steps has every step verified
  (:func:`~statekeeper.catalog.verification.verify_location`: every byte against its
  checksum). A ``StatekeeperTrainer`` step also records the checksum of every Trainer file
  of its ``checkpoint-N`` folder (:data:`~statekeeper.catalog.frameworks.TRAINER_FILES_ENTRY`):
  those files are checked too.
- A foreign entry (a stock Lightning ``.ckpt``, a stock ``checkpoint-N`` or
  ``checkpoint_N`` folder) carries no checksums: it is read in full with statekeeper's safe
  readers (pickles with the restricted reader, never executing code), which finds a
  truncated or corrupted file, but not a changed one. Its status says so (``READ``), with
  the files no reader of statekeeper reads (``unread``: a stock Trainer folder's optimizer,
  scheduler, RNG and arguments pickles beside its weights); one that only pickle could
  load is ``REFUSED``, never loaded.

Torch is imported only to read a foreign entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from statekeeper.catalog.detect import Format
from statekeeper.catalog.frameworks import (
    TRAINER_FILES_ENTRY,
    Framework,
    FrameworkEntry,
    FrameworkFolder,
    entry_steps,
)
from statekeeper.catalog.location import Location
from statekeeper.catalog.manifests import read_manifest
from statekeeper.catalog.verification import (
    StepVerifyReport,
    step_locations,
    verify_location,
)
from statekeeper.errors import StatekeeperError, UnsafePickleError
from statekeeper.format.checksum import Hasher
from statekeeper.progress import Progress
from statekeeper.storage.files import check_name, open_regular

__all__ = ["EntryStatus", "EntryVerifyReport", "FrameworkVerifyReport", "verify_framework"]

_CHUNK = 16 << 20


class EntryStatus(StrEnum):
    """What verifying one entry of a framework folder found."""

    VERIFIED = "verified"  # statekeeper steps: every byte matches its checksum
    DAMAGED = "damaged"  # a checksum, a size or a file's structure is wrong, or it is missing
    READ = "read"  # foreign: read in full by the safe readers; no checksums to compare
    REFUSED = "refused"  # foreign: holds objects only pickle can build; not loaded


@dataclass(frozen=True)
class EntryVerifyReport:
    """One entry: its status, what is wrong (``error``), and its steps' verifications."""

    name: str
    path: str
    step: int | None
    format: str | None
    status: EntryStatus
    error: str | None
    bytes: int
    steps: tuple[StepVerifyReport, ...] = ()
    unread: tuple[str, ...] = ()  # files of a foreign folder no reader of statekeeper reads


@dataclass(frozen=True)
class FrameworkVerifyReport:
    """Every entry of a framework folder; ``ok`` when none is damaged."""

    path: str
    framework: Framework
    entries: tuple[EntryVerifyReport, ...]
    ok: bool = field(init=False)

    def __post_init__(self) -> None:
        ok = all(e.status is not EntryStatus.DAMAGED for e in self.entries)
        object.__setattr__(self, "ok", ok)


def _digest(path: Path) -> str:
    hasher = Hasher()
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def _trainer_files(location: Location, folder: Path) -> list[str]:
    """What is wrong with the Trainer files the step records (path -> checksum)."""
    recorded = read_manifest(location).state
    files = recorded.get(TRAINER_FILES_ENTRY) if isinstance(recorded, dict) else None
    if not isinstance(files, dict):
        return []
    problems = []
    for name, digest in sorted(files.items()):
        if not isinstance(name, str) or not isinstance(digest, str):
            continue
        parts = name.split("/")
        for part in parts:
            check_name(str(folder), part)
        path = folder.joinpath(*parts)
        try:
            if _digest(path) != digest:
                problems.append(f"{name} does not match the checksum its save recorded")
        except FileNotFoundError:
            problems.append(f"{name} is missing")
        except (StatekeeperError, OSError) as exc:
            problems.append(f"{name}: {exc}")
    return problems


def _statekeeper_entry(
    entry: FrameworkEntry, framework: Framework, step: int | None, progress: Progress | None
) -> EntryVerifyReport:
    try:
        locations = step_locations(entry.path, step)
    except (StatekeeperError, OSError) as exc:
        return EntryVerifyReport(
            entry.name, entry.path, entry.step, entry.format, EntryStatus.DAMAGED, str(exc),
            entry.bytes,
        )  # fmt: skip
    steps = tuple(verify_location(location, progress) for location in locations)
    problems = [f"step {s.step}: {s.error}" for s in steps if not s.ok]
    if framework is Framework.TRANSFORMERS and not problems:
        for location in locations:
            problems += _trainer_files(location, Path(entry.path))
    if problems:
        problems[-1] += " (resume from another entry, or re-save it)"
    status = EntryStatus.DAMAGED if problems else EntryStatus.VERIFIED
    error = "; ".join(problems) or None
    return EntryVerifyReport(
        entry.name, entry.path, entry.step, entry.format, status, error, entry.bytes, steps
    )


def _unread(entry: FrameworkEntry, fmt: Format) -> tuple[str, ...]:
    """The files of a foreign folder that its reader does not read (a stock Trainer's
    optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin beside its weights)."""
    from statekeeper.interop.describe import list_files

    folder = Path(entry.path)
    if not folder.is_dir():
        return ()
    read = {row.name for row in list_files(entry.path, fmt)}
    every = (
        (Path(root) / name).relative_to(folder).as_posix()
        for root, _dirs, files in os.walk(folder)
        for name in files
    )
    return tuple(sorted(name for name in every if name not in read))


def _foreign_entry(entry: FrameworkEntry) -> EntryVerifyReport:
    from statekeeper.interop.reading import read_foreign  # the foreign readers need torch

    status, error = EntryStatus.READ, None
    unread: tuple[str, ...] = ()
    if entry.format is None:
        status, error = EntryStatus.DAMAGED, entry.error
    else:
        try:
            read_foreign(entry.path, entry.format)
            unread = _unread(entry, entry.format)
        except UnsafePickleError as exc:
            status, error = EntryStatus.REFUSED, str(exc)
        except (StatekeeperError, OSError, ValueError) as exc:
            status, error = EntryStatus.DAMAGED, str(exc)
    return EntryVerifyReport(
        entry.name, entry.path, entry.step, entry.format, status, error, entry.bytes,
        unread=unread,
    )  # fmt: skip


def verify_framework(
    folder: FrameworkFolder, *, step: int | None = None, progress: Progress | None = None
) -> FrameworkVerifyReport:
    """Every entry of ``folder`` (only those of ``step`` when given), oldest first; see the
    module docstring for what each status means. Never raises for a damaged entry."""
    results = []
    for entry in folder.entries:
        if entry.format is not Format.STATEKEEPER:
            if step is None or entry.step == step:
                results.append(_foreign_entry(entry))
        elif step is None or entry.step == step:
            results.append(_statekeeper_entry(entry, folder.framework, None, progress))
        elif entry.step is None and step in entry_steps(entry):  # a run of many steps
            results.append(_statekeeper_entry(entry, folder.framework, step, progress))
    return FrameworkVerifyReport(folder.path, folder.framework, tuple(results))
