"""Verifying every byte of one step or of every step of a run: :func:`verify_locations` and
its report, :class:`VerifyReport` (:func:`statekeeper.audit.verify` is the entry point). No torch.

Each step is checked by :func:`~statekeeper.catalog.verify_step.verify_step` (manifest, sizes,
checksums, every header and record); a damaged step is reported, never raised, so that one
bad step does not hide the state of the others. ``statekeeper verify`` renders the report;
:func:`statekeeper.catalog.verify.verify` also refuses foreign checkpoints by name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from statekeeper.arguments import require_callable
from statekeeper.catalog.location import (
    Location,
    PathOrStorage,
    committed,
    locate,
    resolve_storage,
)
from statekeeper.catalog.manifests import read_manifest
from statekeeper.catalog.naming import EntryKind, parse_entry
from statekeeper.catalog.verify_step import verify_step
from statekeeper.errors import InvalidArgumentError, StatekeeperError, StepNotFoundError
from statekeeper.format.manifest import MANIFEST
from statekeeper.progress import Progress
from statekeeper.storage.urls import is_url

__all__ = [
    "StepVerifyReport",
    "VerifyReport",
    "step_locations",
    "verify_location",
    "verify_locations",
]


@dataclass(frozen=True)
class StepVerifyReport:
    """The outcome of verifying one committed step.

    Attributes:
        step: The step, or ``None`` when neither the directory name nor the manifest tells.
        path: The step directory.
        ok: Whether every check passed.
        error: What is wrong (the file and the fix); ``None`` when ``ok``.
        bytes: The step's size according to its manifest (0 when that is unreadable).
    """

    step: int | None  # None when neither the directory name nor the manifest tells
    path: str
    ok: bool
    error: str | None  # what is wrong (the file and the fix), None when ``ok``
    bytes: int  # the step's size according to its manifest (0 when that is unreadable)


@dataclass(frozen=True)
class VerifyReport:
    """Every verified step, oldest first; ``ok`` when all of them passed.

    Attributes:
        steps: One :class:`StepVerifyReport` per step, oldest first.
        ok: Whether every step passed.
    """

    steps: tuple[StepVerifyReport, ...]
    ok: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ok", all(step.ok for step in self.steps))

    @property
    def failed(self) -> tuple[StepVerifyReport, ...]:
        return tuple(step for step in self.steps if not step.ok)


def _storage_steps(storage_target: PathOrStorage, step: int | None) -> list[Location]:
    """The step asked for, or every committed step; with none, ``locate`` raises its
    ``StepNotFoundError`` (which says how to make one)."""
    if step is not None:
        return [locate(storage_target, step)]
    storage = resolve_storage(storage_target)
    steps = committed(storage)
    if not steps:
        return [locate(storage_target, None)]
    return [Location(storage, p.name, p.step) for p in steps]


def _local_steps(text: str, step: int | None) -> list[Location]:
    path = Path(text)
    if not path.exists():
        raise StepNotFoundError(f"{text} does not exist; pass a run directory or a step directory")
    if not path.is_dir():
        raise StepNotFoundError(
            f"{text} is not a directory; pass a run directory or a step directory"
        )
    has_manifest = (path / MANIFEST).is_file()
    resolved = path.resolve()
    parsed = parse_entry(resolved.name)
    if not has_manifest and parsed is not None and parsed.kind is EntryKind.COMMITTED:
        if step is not None and step != parsed.step:
            raise InvalidArgumentError(f"{path} is step {parsed.step}; do not pass step={step}")
        return [Location(resolve_storage(resolved.parent), resolved.name, parsed.step)]
    if has_manifest:
        return [locate(path, step)]
    return _storage_steps(path, step)


def step_locations(target: PathOrStorage, step: int | None = None) -> list[Location]:
    """The committed steps to verify: ``target`` itself if it is a step directory, else the
    steps of the run (only ``step`` when given). ``target`` is a path, a URL
    (``s3://bucket/run``, ``memory://run/step_000000100``) or a ``Storage``.

    A directory named like a committed step counts as one even when its manifest is gone, so
    that the damage is reported rather than mistaken for an empty run. Raises
    ``StepNotFoundError`` when there is nothing to verify (a missing path, a file, a run
    without committed steps, no such ``step``) and ``InvalidArgumentError`` for a ``step``
    that contradicts a step directory.
    """
    if isinstance(target, str) and is_url(target):
        last = parse_entry(target.rstrip("/").rpartition("/")[2])
        if step is not None or (last is not None and last.kind is EntryKind.COMMITTED):
            return [locate(target, step)]
        return _storage_steps(target, None)
    if isinstance(target, str | os.PathLike):
        return _local_steps(os.fspath(target), step)
    return _storage_steps(target, step)


def verify_location(location: Location, progress: Progress | None = None) -> StepVerifyReport:
    """Checksums and sizes of every file, then every header and record checked against the
    manifest (:func:`~statekeeper.catalog.verify_step.verify_step`: no tensor is built).

    Never raises for a damaged, unreadable or vanished step: the result says what is wrong.
    ``progress(done, total)`` counts the bytes of the step's files as they are checked.
    """
    step = location.step if location.step >= 0 else None
    size = 0
    try:
        manifest = read_manifest(location)
        step = manifest.step
        size = sum(record.size for record in manifest.files.values())
        size += location.storage.size(location.entry, MANIFEST)
        verify_step(location, progress)  # checksums, then every record
    except (StatekeeperError, OSError) as exc:
        return StepVerifyReport(step, location.path(), False, str(exc), size)
    return StepVerifyReport(step, location.path(), True, None, size)


def _data_bytes(location: Location) -> int:
    """The bytes of the step's files per its manifest; 0 when that is unreadable."""
    try:
        return sum(record.size for record in read_manifest(location).files.values())
    except (StatekeeperError, OSError):
        return 0


def _verify_all(locations: Sequence[Location], progress: Progress) -> list[StepVerifyReport]:
    """Each step with ``progress`` counting over all of them (the total never changes)."""
    sizes = [_data_bytes(location) for location in locations]
    total, base = sum(sizes), 0
    results = []
    for location, size in zip(locations, sizes, strict=True):

        def shifted(done: int, _step_total: int, base: int = base) -> None:
            progress(min(base + done, total), total)

        results.append(verify_location(location, shifted))
        base += size
        progress(base, total)  # a step that failed early still counts as checked
    return results


def verify_locations(
    locations: Sequence[Location], progress: Progress | None = None
) -> VerifyReport:
    """Each of ``locations`` verified by :func:`verify_location`, in order;
    ``progress(done, total)`` counts bytes over all of them."""
    require_callable("progress", progress, "progress(done, total)")
    if progress is None:
        return VerifyReport(tuple(verify_location(location) for location in locations))
    return VerifyReport(tuple(_verify_all(locations, progress)))
