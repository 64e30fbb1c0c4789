"""Folders of framework checkpoints: which framework wrote them and their entries, by name.

The frameworks keep one entry per saved step beside the others, named by convention:

- Lightning's ``ModelCheckpoint`` (its ``dirpath``): ``*.ckpt`` entries
  (``epoch=1-step=300.ckpt``, ``last.ckpt``). With statekeeper's ``StatekeeperCheckpointIO``
  each is a directory holding one statekeeper step; with Lightning's own, a ``torch.save``
  pickle that statekeeper reads only with its restricted reader.
- The transformers ``Trainer`` (its ``output_dir``): ``checkpoint-<global step>`` folders.
  ``StatekeeperTrainer`` writes a statekeeper step inside each (beside the Trainer's files,
  whose checksums that step records under :data:`TRAINER_FILES_ENTRY`); the stock Trainer,
  safetensors weights and pickled optimizer, scheduler and RNG files.
- Accelerate with ``automatic_checkpoint_naming`` (its ``project_dir``): ``checkpoints/``,
  which statekeeper's route makes a run directory of statekeeper steps, and where
  ``Accelerator.save_state`` writes ``checkpoint_<iteration>`` folders. The ``checkpoints``
  folder itself is recognised too.

Only names and a few leading bytes are read here (no manifest, no torch); the layouts are
conventions of the frameworks, not statekeeper's (``integrations`` writes them; this module
reads them and imports nothing of it).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from statekeeper.catalog.detect import Format, detect
from statekeeper.catalog.location import is_step_dir
from statekeeper.catalog.naming import EntryKind, parse_entry
from statekeeper.errors import StatekeeperError, StepNotFoundError

__all__ = [
    "TRAINER_FILES_ENTRY",
    "Framework",
    "FrameworkEntry",
    "FrameworkFolder",
    "entry_steps",
    "framework_entry",
    "framework_folder",
]

TRAINER_FILES_ENTRY = "files"
"""The entry of a ``StatekeeperTrainer`` step that maps each Trainer file of its
``checkpoint-N`` folder (path relative to it) to its xxh3-128 digest."""

_LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
_TRAINER = re.compile(r"^checkpoint-(\d+)$")
_ACCELERATE = re.compile(r"^checkpoint_(\d+)$")
_ACCELERATE_RUN = "checkpoints"


class Framework(StrEnum):
    """The framework whose folder of checkpoints a path is."""

    LIGHTNING = "lightning"  # ModelCheckpoint's dirpath: *.ckpt
    TRANSFORMERS = "transformers"  # Trainer's output_dir: checkpoint-N
    ACCELERATE = "accelerate"  # project_dir: checkpoints/ (checkpoint_N, or statekeeper steps)


@dataclass(frozen=True)
class FrameworkEntry:
    """One saved checkpoint of a framework folder.

    ``format`` is ``statekeeper`` for an entry that holds statekeeper steps (a run
    directory: verify and list it as one), else the foreign format statekeeper reads it as,
    or None with ``error`` saying why it is none. ``step`` comes from the name (None when
    the name has none, as ``last.ckpt``)."""

    name: str  # relative to the folder, with / separators
    path: str
    step: int | None
    format: Format | None
    bytes: int
    error: str | None = None


@dataclass(frozen=True)
class FrameworkFolder:
    """A folder of framework checkpoints and its entries, by step (unnumbered ones last)."""

    path: str
    framework: Framework
    entries: tuple[FrameworkEntry, ...]

    def newest(self, step: int | None = None) -> FrameworkEntry | None:
        """The entry of ``step`` (the newest numbered one holding it when None)."""
        numbered = [e for e in self.entries if e.step is not None]
        if step is None:
            return numbered[-1] if numbered else (self.entries[-1] if self.entries else None)
        found = [e for e in numbered if e.step == step]
        return found[-1] if found else None


def _holds_steps(path: Path) -> bool:
    """A statekeeper step directory, or a run directory with a committed step."""
    if is_step_dir(path):
        return True
    try:
        children = list(path.iterdir())
    except OSError:
        return False
    return any(
        (p := parse_entry(c.name)) is not None and p.kind is EntryKind.COMMITTED for c in children
    )


def _size(path: Path) -> int:
    if not path.is_dir():
        return path.stat().st_size if path.is_file() else 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _saved(folder: Path, path: Path, step: int | None) -> FrameworkEntry:
    """The entry of one saved checkpoint; a symbolic link is named, never followed (neither
    its bytes read nor its tree walked: a link to ``/`` would walk the file system)."""
    if not path.is_symlink():
        return _entry(folder, path, step)
    error = (
        f"{path} is a symbolic link (to {os.readlink(path)}); statekeeper does not follow "
        "links in a checkpoint folder: put the checkpoint itself there, or pass its real path"
    )
    return FrameworkEntry(path.relative_to(folder).as_posix(), str(path), step, None, 0, error)


def _entry(folder: Path, path: Path, step: int | None) -> FrameworkEntry:
    name = path.relative_to(folder).as_posix()
    fmt: Format | None = None
    error = None
    try:
        if path.is_dir() and _holds_steps(path):
            fmt = Format.STATEKEEPER
        else:
            fmt = detect(path)
            if fmt is None:
                error = "holds no checkpoint format statekeeper reads"
    except (StatekeeperError, OSError) as exc:
        error = str(exc)
    return FrameworkEntry(name, str(path), step, fmt, _size(path), error)


def _ordered(entries: list[FrameworkEntry]) -> tuple[FrameworkEntry, ...]:
    return tuple(sorted(entries, key=lambda e: (e.step is None, e.step or 0, e.name)))


def _lightning(folder: Path, children: list[Path]) -> FrameworkFolder | None:
    ckpts = [c for c in children if c.name.endswith(".ckpt")]
    if not ckpts:
        return None
    entries = []
    for path in ckpts:
        found = _LIGHTNING_STEP.search(path.name.removesuffix(".ckpt"))
        entries.append(_saved(folder, path, int(found.group(1)) if found else None))
    return FrameworkFolder(str(folder), Framework.LIGHTNING, _ordered(entries))


def _numbered(
    folder: Path, children: list[Path], pattern: re.Pattern[str], framework: Framework
) -> FrameworkFolder | None:
    entries = [
        _saved(folder, c, int(m.group(1)))
        for c in children
        if (m := pattern.match(c.name)) is not None and c.is_dir()
    ]
    return FrameworkFolder(str(folder), framework, _ordered(entries)) if entries else None


def _accelerate_project(folder: Path) -> FrameworkFolder | None:
    runs = folder / _ACCELERATE_RUN
    if not runs.is_dir():
        return None
    if _holds_steps(runs):  # statekeeper's Accelerate route: a run directory
        return FrameworkFolder(str(folder), Framework.ACCELERATE, (_entry(folder, runs, None),))
    children = sorted(runs.iterdir())
    found = _numbered(folder, children, _ACCELERATE, Framework.ACCELERATE)
    return found


def entry_steps(entry: FrameworkEntry) -> list[int]:
    """The committed step numbers inside a statekeeper entry, by name (nothing read)."""
    path = Path(entry.path)
    if entry.format is not Format.STATEKEEPER or is_step_dir(path):
        return [entry.step] if entry.step is not None else []
    return sorted(
        p.step
        for c in path.iterdir()
        if (p := parse_entry(c.name)) is not None and p.kind is EntryKind.COMMITTED
    )


def framework_folder(path: str | os.PathLike[str]) -> FrameworkFolder | None:
    """The framework folder a local directory ``path`` is, or None: not a directory, a
    statekeeper run or step directory itself, or holding no framework entries."""
    folder = Path(path)
    try:  # a name the file system refuses (too long...) is no framework folder: the
        # statekeeper path checks that follow name the problem
        if "://" in os.fspath(path) or not folder.is_dir() or _holds_steps(folder):
            return None
        children = sorted(folder.iterdir())
    except OSError:
        return None
    return (
        _lightning(folder, children)
        or _numbered(folder, children, _TRAINER, Framework.TRANSFORMERS)
        or _numbered(folder, children, _ACCELERATE, Framework.ACCELERATE)
        or _accelerate_project(folder)
    )


def framework_entry(folder: FrameworkFolder, step: int | None) -> tuple[FrameworkEntry, int | None]:
    """The entry ``inspect`` shows (the newest, or the one holding ``step``) and the step to
    ask of it (for a statekeeper run of many steps); ``StepNotFoundError`` naming the steps
    there when none holds ``step``."""
    found = folder.newest(step)
    if found is not None:
        return found, None
    if step is not None:
        for entry in reversed(folder.entries):
            if entry.step is None and step in entry_steps(entry):
                return entry, step
    steps = sorted({s for e in folder.entries for s in entry_steps(e)})
    raise StepNotFoundError(
        f"{folder.path}: no {folder.framework} entry of step {step} (steps there: "
        f"{', '.join(map(str, steps)) or 'none numbered'}); pass one of them"
    )
