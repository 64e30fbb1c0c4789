"""What a statekeeper step holds, read from its verified manifest alone (no tensor data, no
torch): :func:`inspect_step` and its report, :class:`InspectReport`.

``statekeeper inspect`` renders this report; :func:`statekeeper.interop.inspection.inspect`
adds foreign checkpoint files and folders.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statekeeper.catalog.inspection_tree import Ref, decode, relative, summary, walk
from statekeeper.catalog.location import Location, PathOrStorage, locate
from statekeeper.catalog.manifests import read_manifest
from statekeeper.errors import CorruptCheckpointError, StepNotFoundError
from statekeeper.format.dtypes import ITEMSIZE
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.storage.urls import is_url

__all__ = [
    "EntryReport",
    "ReportTotals",
    "InspectReport",
    "UNREFERENCED",
    "TensorRow",
    "ValueRow",
    "inspect_location",
    "inspect_step",
]

UNREFERENCED = "(unreferenced)"
"""The entry that lists stored tensors no entry of the state refers to."""


@dataclass(frozen=True)
class TensorRow:
    """One tensor of a step, as its manifest records it."""

    name: str  # the tensor's name in the manifest (its full key path)
    key: str  # its key path inside the top-level entry ("" when the entry is the tensor)
    shape: tuple[int, ...]
    dtype: str
    bytes: int  # numel * element size; 0 for an alias
    file: str | None  # the file holding it; None for an alias or a sharded tensor
    alias_of: str | None  # the stored tensor whose memory an alias shares
    numpy: bool = False  # saved from a numpy array
    in_state: bool = True  # False for a stored base that only aliases refer to
    chunks: int = 0  # of a sharded tensor (a multi-process save): how many pieces hold it


@dataclass(frozen=True)
class ValueRow:
    """One non-tensor value of a step (a list of plain values counts as one)."""

    path: str  # its full key path
    key: str  # its key path inside the top-level entry
    type: str  # its Python type's name
    value: str  # its repr when short, else a summary such as "<list of 500 int>"
    complete: bool  # whether ``value`` is the full repr


@dataclass(frozen=True)
class EntryReport:
    """One top-level entry of the saved state (``"model"``, ``"optimizer"``, ...). A sharded
    step's per-rank entries are named ``"<entry> (rank <r>)"``; stored tensors that no entry
    refers to are listed under ``"(unreferenced)"``."""

    name: str
    type: str  # the Python type's name of its saved value
    tensors: tuple[TensorRow, ...]
    values: tuple[ValueRow, ...]
    tensor_bytes: int


@dataclass(frozen=True)
class ReportTotals:
    """Counts and sizes over the whole step."""

    tensors: int  # tensors of the state (aliases included)
    stored: int  # tensors stored in files
    aliases: int
    tensor_bytes: int
    values: int  # non-tensor values
    files: int  # the manifest included
    file_bytes: int  # on disk, the manifest included
    written_bytes: int = 0  # what its save wrote: file_bytes less the files it reused


@dataclass(frozen=True)
class InspectReport:
    """What one committed step holds: :func:`inspect_step` returns it.

    Attributes:
        path: The step directory.
        step: The step number.
        created: When it was committed, as the manifest records it.
        library: The versions of the libraries that wrote it.
        origin: Where it was written, as ``Origin`` allowed.
        metrics: The metrics saved with it.
        entries: One report per top-level entry: its tensors and plain values.
        aliases: Tensors that share memory with a stored one: alias to that tensor.
        totals: Counts and bytes over the step.
        reused: Files an incremental save reused: file to the ``<entry>/<file>`` it reuses.
    """

    path: str
    step: int
    created: str  # ISO 8601, as the manifest records it
    library: Mapping[str, str]  # the versions that wrote it ({"statekeeper": ..., "torch": ...})
    origin: Mapping[str, Any]  # where: host, command line, world size, devices, git (or {})
    metrics: Mapping[str, Any]
    entries: tuple[EntryReport, ...]
    aliases: Mapping[str, str]  # alias name -> the stored tensor whose memory it shares
    totals: ReportTotals
    reused: Mapping[str, str] = field(default_factory=dict)  # file -> "<entry>/<file>" it reuses


class _Rows:
    """Rows of one manifest's tensors (item sizes looked up once per dtype)."""

    def __init__(self, manifest: Manifest, where: str) -> None:
        self.manifest, self.where = manifest, where
        self.sharded = manifest.sharding.tensors if manifest.sharding is not None else {}
        self.sizes: dict[str, int] = {}

    def itemsize(self, dtype: str) -> int:
        size = self.sizes.get(dtype)
        if size is None:
            found = ITEMSIZE.get(dtype)
            if found is None:
                raise CorruptCheckpointError(self.where, f"unknown tensor dtype {dtype!r}")
            size = self.sizes[dtype] = found
        return size

    def row(self, name: str, key: str, ref: Ref | None) -> TensorRow:
        manifest = self.manifest
        numpy = ref is not None and ref.tag == "$ndarray"
        in_state = ref is not None
        sharded = self.sharded.get(name)
        if sharded is not None:
            size = math.prod(sharded.shape) * self.itemsize(sharded.dtype)
            return TensorRow(
                name, key, tuple(sharded.shape), sharded.dtype, size, None, None, numpy, True,
                len(sharded.chunks),
            )  # fmt: skip
        rec = manifest.tensors.get(name)
        if rec is not None:
            size = math.prod(rec.shape) * self.itemsize(rec.dtype)
            return TensorRow(
                name, key, tuple(rec.shape), rec.dtype, size, rec.file, None, numpy, in_state
            )
        alias = manifest.aliases.get(name)
        if alias is None or alias.base not in manifest.tensors:
            raise CorruptCheckpointError(self.where, f"state refers to unknown tensor {name!r}")
        base = manifest.tensors[alias.base]
        return TensorRow(
            name, key, tuple(alias.shape), base.dtype, 0, None, alias.base, numpy, in_state
        )


def _check_claims(where: str, manifest: Manifest, rows: list[TensorRow]) -> None:
    """The tensor records of each file claim no more bytes than the file holds (a crafted
    manifest could otherwise report terabytes of tensors in a step of a few kilobytes)."""
    claimed: dict[str, int] = {}
    for row in rows:
        if row.file is not None:
            claimed[row.file] = claimed.get(row.file, 0) + row.bytes
    for file, total in claimed.items():
        record = manifest.files.get(file)
        if record is not None and total > record.size:
            raise CorruptCheckpointError(
                where, f"its tensors claim {total} bytes of {file}, which holds {record.size}"
            )


def inspect_location(location: Location) -> InspectReport:
    """The report of one committed step, from its manifest (read and self-verified here).

    Raises ``CorruptCheckpointError`` for a missing or damaged manifest, or one whose records
    disagree (an unknown dtype or tensor, tensors claiming more bytes than their file holds);
    ``UnsupportedFormatError`` for a format this release does not read; ``StepNotFoundError``
    for a step deleted meanwhile.
    """
    manifest = read_manifest(location)
    where = location.path(MANIFEST)
    state, metrics = decode(manifest, where)
    building: dict[str, tuple[str, list[TensorRow], list[ValueRow]]] = {}
    seen: set[str] = set()
    rows = _Rows(manifest, where)
    sharding = manifest.sharding
    for name, value in state.items():
        tensors: list[TensorRow] = []
        values: list[ValueRow] = []
        building[name] = (type(value).__name__, tensors, values)
        refs: list[tuple[str, Ref]] = []
        leaves: list[tuple[str, Any]] = []
        walk(value, name, refs, leaves)
        for path, ref in refs:
            seen.add(ref.name)
            if sharding is not None and ref.name in sharding.tensors:
                seen.update(c.tensor for c in sharding.tensors[ref.name].chunks)
            tensors.append(rows.row(ref.name, relative(path, name), ref))
        for path, leaf in leaves:
            shown, complete = summary(leaf)
            values.append(
                ValueRow(path, relative(path, name), type(leaf).__name__, shown, complete)
            )
    for name in sorted(set(manifest.tensors) - seen):  # stored bases that only aliases use
        owner = name.split("/", 1)[0]
        entry = building.get(owner) or building.setdefault(UNREFERENCED, ("tensors", [], []))
        entry[1].append(rows.row(name, relative(name, owner), None))
    entries = tuple(
        EntryReport(name, kind, tuple(tensors), tuple(values), sum(r.bytes for r in tensors))
        for name, (kind, tensors, values) in building.items()
    )
    every = [row for entry in entries for row in entry.tensors]
    _check_claims(where, manifest, every)
    manifest_size = location.storage.size(location.entry, MANIFEST)
    totals = ReportTotals(
        tensors=sum(1 for row in every if row.in_state),
        stored=len(manifest.tensors),
        aliases=len(manifest.aliases),
        tensor_bytes=sum(row.bytes for row in every),
        values=sum(len(entry.values) for entry in entries),
        files=len(manifest.files) + 1,
        file_bytes=manifest_size + sum(f.size for f in manifest.files.values()),
        written_bytes=manifest_size + manifest.written_bytes(),
    )
    return InspectReport(
        path=location.path(),
        step=manifest.step,
        created=manifest.created,
        library=dict(manifest.library),
        origin=dict(manifest.origin),
        metrics=metrics,
        entries=entries,
        aliases={name: alias.base for name, alias in manifest.aliases.items()},
        totals=totals,
        reused=dict(manifest.reused),
    )


def inspect_step(path: PathOrStorage, step: int | None = None) -> InspectReport:
    """What a committed statekeeper step holds: entries, tensors (name, shape, dtype, bytes,
    file, aliases), plain values (summarized when long), metrics and totals. Only the manifest
    is read (and verified); :func:`statekeeper.audit.verify` checks
    the tensor data too. Needs no torch.

    ``path`` is a run directory (its newest step, or ``step``), a step directory, a URL
    (``s3://bucket/run``, ``memory://run/step_000000100``) or a ``Storage``.

    Raises ``StepNotFoundError`` when the path is not a directory or holds no such committed
    step, ``InvalidArgumentError`` for a ``step`` that contradicts a step directory, and what
    :func:`inspect_location` raises for a damaged step.

    >>> report = inspect_step("runs/exp1", step=100)  # doctest: +SKIP
    >>> report.totals.tensor_bytes, [entry.name for entry in report.entries]  # doctest: +SKIP
    (4416, ['model', 'optimizer', 'epoch'])
    """
    local = not (isinstance(path, str) and is_url(path))
    if local and isinstance(path, str | os.PathLike) and not Path(path).is_dir():
        raise StepNotFoundError(
            f"{os.fspath(path)} is not a directory; pass a run directory or a step directory"
        )
    return inspect_location(locate(path, step))
