"""Turning what users pass (a path or a Storage) into a storage and a committed step."""

from __future__ import annotations

import os
import re
from pathlib import Path

from statekeeper.arguments import require_step
from statekeeper.catalog.naming import EntryKind, ParsedEntry, parse_entry, step_entry
from statekeeper.catalog.paths import checked_path
from statekeeper.errors import InvalidArgumentError, InvalidArgumentTypeError, StepNotFoundError
from statekeeper.format.manifest import MANIFEST
from statekeeper.storage.base import Storage
from statekeeper.storage.local import LocalStorage
from statekeeper.storage.optional import capabilities_of
from statekeeper.storage.urls import is_url, storage_for_url

__all__ = [
    "Location",
    "classify",
    "committed",
    "is_step_dir",
    "locate",
    "resolve_storage",
    "set_aside_entries",
    "validate_step",
]

PathOrStorage = str | os.PathLike[str] | Storage


def resolve_storage(directory: PathOrStorage) -> Storage:
    """A Storage for ``directory``: a path becomes a :class:`LocalStorage`, a URL
    (``file://``, ``memory://``, ``s3://``, ...) the storage :func:`storage_for_url` picks."""
    if isinstance(directory, str) and is_url(directory):
        return storage_for_url(directory)
    if isinstance(directory, str | os.PathLike):
        path = Path(checked_path(directory))
        if path.exists() and not path.is_dir():
            raise StepNotFoundError(
                f"{path} is a file, not a statekeeper run or step directory: pass a directory "
                "(statekeeper.read and `statekeeper inspect` also open foreign checkpoint files)"
            )
        return LocalStorage(directory)
    if isinstance(directory, Storage):
        return directory
    raise InvalidArgumentTypeError(
        f"expected a directory path or a statekeeper Storage, got {type(directory).__name__}"
    )


def validate_step(step: object) -> int:
    """``step`` when it is an int >= 0 (``InvalidArgumentTypeError`` for another type)."""
    return require_step(step)


def committed(storage: Storage) -> list[ParsedEntry]:
    """Committed steps in ascending order: ``step_N``, or, where an overwrite was interrupted
    between its renames (no ``step_N``), the copy it set aside (``step_N.replaced-<id>``),
    which is then the committed copy (see ``storage/commit.py``)."""
    return classify(storage.entries())[0]


def classify(entries: list[str]) -> tuple[list[ParsedEntry], list[ParsedEntry]]:
    """``entries`` as (committed steps ascending, leftovers): leftovers are the entries that
    clean-up removes (partial, removing, superseded replaced); ``.damaged-`` entries are
    neither (evidence, see :func:`set_aside_entries`)."""
    parsed = [p for p in map(parse_entry, entries) if p is not None]
    steps = {p.step: p for p in parsed if p.kind is EntryKind.COMMITTED}
    leftovers = []
    for p in sorted(parsed, key=lambda p: p.name):
        if p.kind is EntryKind.REPLACED and p.step not in steps:
            steps[p.step] = p  # the committed copy, set aside by an interrupted overwrite
        elif p.kind not in (EntryKind.COMMITTED, EntryKind.DAMAGED):
            leftovers.append(p)
    return [steps[s] for s in sorted(steps)], leftovers


def set_aside_entries(entries: list[str]) -> list[ParsedEntry]:
    """The damaged steps a restarted run set aside (kept as evidence, never read)."""
    parsed = (parse_entry(e) for e in entries)
    return [p for p in parsed if p is not None and p.kind is EntryKind.DAMAGED]


class Location:
    """One committed step in a storage."""

    def __init__(self, storage: Storage, entry: str, step: int) -> None:
        self.storage = storage
        self.entry = entry
        self.step = step

    def path(self, name: str = "") -> str:
        return self.storage.describe(self.entry, name)

    def relocate(self) -> bool:
        """Find the step again by its number after its entry vanished: the writer's recovery
        renamed the set-aside copy being read (``step_N.replaced-<id>``) back to ``step_N``,
        or an overwrite set ``step_N`` aside between its two renames. Whether it is committed
        under another name now (``entry`` then names it: same files, same bytes)."""
        if self.step < 0:
            return False
        for p in committed(self.storage):
            if p.step == self.step and p.name != self.entry:
                self.entry = p.name
                return True
        return False

    def gone(self) -> bool:
        """Whether the step is no longer committed (deleted while it was being read); a step
        committed under another name now (:meth:`relocate`) is not gone."""
        if self.step < 0 or self.entry in self.storage.entries():
            return False
        return not self.relocate()

    def gone_error(self) -> StepNotFoundError:
        return StepNotFoundError(
            f"{self.path()} was deleted while it was being read (retention by the writing "
            "process, or a manual delete); nothing of it was applied. Load another step "
            "(statekeeper ls lists them)."
        )


_SHARD_FILE = re.compile(r"(tensors|chunks|rank)-\d{5,}\.safetensors")
"""The names statekeeper gives the tensor files of a step (see format/tensors.py and the
distributed package)."""


def is_step_dir(path: Path) -> bool:
    """Whether ``path`` is a statekeeper step directory: it holds an entry named
    manifest.json, whatever it is (a damaged one is still a step's, and reading it says what
    is wrong), or it is named as a committed step and holds statekeeper's tensor files (its
    manifest lost). A foreign checkpoint folder that happens to be named ``step_N`` is not."""
    if os.path.lexists(path / MANIFEST):
        return True
    parsed = parse_entry(path.name)
    if parsed is None or parsed.kind is not EntryKind.COMMITTED or not path.is_dir():
        return False
    return any(_SHARD_FILE.fullmatch(child.name) for child in path.iterdir())


def _set_aside_copy(path: Path, step: int | None) -> Location | None:
    """The committed copy of the step directory ``path`` where an interrupted overwrite left
    it set aside (``path`` itself gone, ``path.replaced-<id>`` beside it), else None."""
    parsed = parse_entry(path.name)
    if parsed is None or parsed.kind is not EntryKind.COMMITTED or os.path.lexists(path):
        return None
    if not path.parent.is_dir():
        return None
    storage = LocalStorage(path.parent)
    for p in committed(storage):
        if p.step == parsed.step and p.name != path.name:
            if step is not None and step != parsed.step:
                raise InvalidArgumentError(f"{path} is a single step; do not pass step={step}")
            return Location(storage, p.name, p.step)
    return None


def locate(directory: PathOrStorage, step: int | None) -> Location:
    """The committed step ``step`` (newest when None) of a run directory.

    A path or URL that is itself a step directory (it holds ``manifest.json``) is accepted
    too.
    """
    if isinstance(directory, str) and is_url(directory):
        parent, _, last = directory.rstrip("/").rpartition("/")
        parent += "/" if parent.endswith(":/") else ""  # memory://step_1: the parent is memory://
        parsed = parse_entry(last)
        if parsed is not None and parsed.kind is EntryKind.COMMITTED and is_url(parent):
            if step is not None and step != parsed.step:
                raise InvalidArgumentError(f"{directory} is a single step; do not pass step={step}")
            storage = resolve_storage(parent)
            if last in storage.entries():
                return Location(storage, last, parsed.step)
    if isinstance(directory, str | os.PathLike) and is_step_dir(Path(checked_path(directory))):
        path = Path(directory).resolve()
        parsed = parse_entry(path.name)
        if step is not None and (parsed is None or parsed.step != step):
            raise InvalidArgumentError(f"{path} is a single step; do not pass step={step}")
        return Location(LocalStorage(path.parent), path.name, parsed.step if parsed else -1)
    if isinstance(directory, str | os.PathLike):
        aside = _set_aside_copy(Path(directory), step)
        if aside is not None:
            return aside
    storage = resolve_storage(directory)
    if capabilities_of(storage).directories and not storage.exists():  # type: ignore[attr-defined]
        raise StepNotFoundError(
            f"{storage.describe()} does not exist: no run or step directory at that path "
            "(check the path and the working directory)"
        )
    steps = committed(storage)
    if step is None:
        if not steps:
            raise StepNotFoundError(
                f"{storage.describe()} holds no committed checkpoint; save one first "
                "(directories ending in .partial-* are interrupted saves and are never read)"
            )
        return Location(storage, steps[-1].name, steps[-1].step)
    validate_step(step)
    for p in steps:
        if p.step == step:
            return Location(storage, p.name, step)
    known = ", ".join(str(p.step) for p in steps[-10:]) or "none"
    raise StepNotFoundError(
        f"{storage.describe(step_entry(step))} does not exist; committed steps: {known}"
    )
