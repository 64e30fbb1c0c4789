"""``statekeeper inspect``: what a checkpoint holds, read from its verified manifest alone."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from statekeeper.checkpoint.location import Location, locate
from statekeeper.checkpoint.manifests import read_manifest
from statekeeper.cli import render, render_inspect, render_interop
from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.dtypes import ITEMSIZE
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.values import decode_value, join_path
from statekeeper.interop.detect import foreign_format
from statekeeper.storage.urls import is_url

__all__ = ["EntryReport", "Report", "TensorRow", "Totals", "ValueRow", "build_report", "inspect"]

SHORT_VALUE = 60
"""Values whose ``repr`` is at most this long are shown; longer ones are summarized."""


@dataclass(frozen=True)
class TensorRow:
    name: str  # the tensor's name in the manifest (its full key path)
    key: str  # its key path inside the top-level entry
    shape: list[int]
    dtype: str
    bytes: int  # numel * element size; 0 for an alias
    file: str | None
    alias_of: str | None
    numpy: bool = False
    in_state: bool = True  # False for a stored base that only aliases refer to
    chunks: int = 0  # of a sharded tensor (a multi-process save): how many pieces hold it


@dataclass(frozen=True)
class ValueRow:
    path: str
    key: str
    type: str
    value: str  # its repr when short, else a summary such as "<list of 500 int>"
    complete: bool  # whether ``value`` is the full repr


@dataclass
class EntryReport:
    name: str
    type: str
    tensors: list[TensorRow] = field(default_factory=list)
    values: list[ValueRow] = field(default_factory=list)
    tensor_bytes: int = 0


@dataclass(frozen=True)
class Totals:
    tensors: int
    stored: int
    aliases: int
    tensor_bytes: int
    values: int
    files: int
    file_bytes: int


@dataclass(frozen=True)
class Report:
    path: str
    step: int
    created: str
    library: dict[str, str]
    metrics: dict[str, Any]
    entries: list[EntryReport]
    aliases: dict[str, str]
    totals: Totals


@dataclass(frozen=True)
class _Ref:
    tag: str
    name: str


def _summary(value: Any) -> tuple[str, bool]:
    text = repr(value)
    if len(text) <= SHORT_VALUE:
        return text, True
    if isinstance(value, str):
        return f"<str of {len(value)} characters>", False
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>", False
    if isinstance(value, list | tuple):
        kinds = sorted({type(v).__name__ for v in value})
        return f"<{type(value).__name__} of {len(value)} {'/'.join(kinds)}>", False
    return text[: SHORT_VALUE - 3] + "...", False


def _is_container(value: Any) -> bool:
    return isinstance(value, Mapping) or type(value) in (list, tuple)


def _walk(
    value: Any, path: str, refs: list[tuple[str, _Ref]], leaves: list[tuple[str, Any]]
) -> None:
    """Collect tensor references and non-tensor leaves in traversal order.

    A list or tuple of plain values (no containers, no tensors) counts as one leaf.
    """
    if isinstance(value, _Ref):
        refs.append((path, value))
    elif isinstance(value, Mapping) and value:
        for key, child in value.items():
            _walk(child, join_path(path, key), refs, leaves)
    elif type(value) in (list, tuple) and any(
        _is_container(v) or isinstance(v, _Ref) for v in value
    ):
        for i, child in enumerate(value):
            _walk(child, join_path(path, i), refs, leaves)
    else:
        leaves.append((path, value))


def _itemsize(dtype: str, where: str) -> int:
    found = ITEMSIZE.get(dtype)
    if found is None:
        raise CorruptCheckpointError(where, f"unknown tensor dtype {dtype!r}")
    return found


class _Rows:
    """Rows of one manifest's tensors (item sizes looked up once per dtype)."""

    def __init__(self, manifest: Manifest, where: str) -> None:
        self.manifest, self.where = manifest, where
        self.sharded = manifest.sharding.tensors if manifest.sharding is not None else {}
        self.sizes: dict[str, int] = {}

    def itemsize(self, dtype: str) -> int:
        size = self.sizes.get(dtype)
        if size is None:
            size = self.sizes[dtype] = _itemsize(dtype, self.where)
        return size

    def row(self, name: str, key: str, ref: _Ref | None) -> TensorRow:
        manifest = self.manifest
        numpy = ref is not None and ref.tag == "$ndarray"
        in_state = ref is not None
        sharded = self.sharded.get(name)
        if sharded is not None:
            size = math.prod(sharded.shape) * self.itemsize(sharded.dtype)
            return TensorRow(
                name, key, list(sharded.shape), sharded.dtype, size, None, None, numpy, True,
                len(sharded.chunks),
            )  # fmt: skip
        rec = manifest.tensors.get(name)
        if rec is not None:
            size = math.prod(rec.shape) * self.itemsize(rec.dtype)
            return TensorRow(
                name, key, list(rec.shape), rec.dtype, size, rec.file, None, numpy, in_state
            )
        alias = manifest.aliases.get(name)
        if alias is None or alias.base not in manifest.tensors:
            raise CorruptCheckpointError(self.where, f"state refers to unknown tensor {name!r}")
        base = manifest.tensors[alias.base]
        return TensorRow(
            name, key, list(alias.shape), base.dtype, 0, None, alias.base, numpy, in_state
        )


def _relative(path: str, entry: str) -> str:
    return path[len(entry) + 1 :] if path.startswith(entry + "/") else ""


def _decode(manifest: Manifest, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state (tensors as references) and metrics; the per-rank entries of a sharded step
    appear as ``"<entry> (rank <r>)"``."""

    def on_ref(tag: str, name: str) -> _Ref:
        return _Ref(tag, name)

    def no_ref(tag: str, name: str) -> _Ref:
        raise ValueError(f"metrics cannot refer to tensor {name!r}")

    skeletons: list[tuple[int | None, Any]] = [(None, manifest.state)]
    if manifest.sharding is not None:
        skeletons += list(enumerate(manifest.sharding.ranks))
    state: dict[str, Any] = {}
    try:
        for rank, skeleton in skeletons:
            part = decode_value(skeleton, "", on_ref)
            if not isinstance(part, dict):
                raise CorruptCheckpointError(where, "state is not a mapping")
            suffix = "" if rank is None else f" (rank {rank})"
            state.update({f"{k}{suffix}": v for k, v in part.items()})
        metrics = {k: decode_value(v, k, no_ref) for k, v in manifest.metrics.items()}
    except ValueError as exc:
        raise CorruptCheckpointError(where, f"state is malformed: {exc}") from None
    return state, metrics


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


def build_report(location: Location, manifest: Manifest) -> Report:
    """Describe a checkpoint from its manifest; no tensor data is read."""
    where = location.path(MANIFEST)
    state, metrics = _decode(manifest, where)
    entries: dict[str, EntryReport] = {}
    seen: set[str] = set()
    rows = _Rows(manifest, where)
    for name, value in state.items():
        entry = entries[str(name)] = EntryReport(str(name), type(value).__name__)
        refs: list[tuple[str, _Ref]] = []
        leaves: list[tuple[str, Any]] = []
        _walk(value, str(name), refs, leaves)
        for path, ref in refs:
            seen.add(ref.name)
            if manifest.sharding is not None and ref.name in manifest.sharding.tensors:
                seen.update(c.tensor for c in manifest.sharding.tensors[ref.name].chunks)
            entry.tensors.append(rows.row(ref.name, _relative(path, entry.name), ref))
        for path, leaf in leaves:
            shown, complete = _summary(leaf)
            key = _relative(path, entry.name)
            entry.values.append(ValueRow(path, key, type(leaf).__name__, shown, complete))
    for name in sorted(set(manifest.tensors) - seen):  # stored bases that only aliases use
        owner = name.split("/", 1)[0]
        entry = entries.get(owner) or entries.setdefault(
            "(unreferenced)", EntryReport("(unreferenced)", "tensors")
        )
        entry.tensors.append(rows.row(name, _relative(name, owner), None))
    for entry in entries.values():
        entry.tensor_bytes = sum(row.bytes for row in entry.tensors)
    _check_claims(where, manifest, [row for e in entries.values() for row in e.tensors])
    manifest_bytes = location.storage.size(location.entry, MANIFEST)
    every = [row for entry in entries.values() for row in entry.tensors]
    totals = Totals(
        tensors=sum(1 for row in every if row.in_state),
        stored=len(manifest.tensors),
        aliases=len(manifest.aliases),
        tensor_bytes=sum(row.bytes for row in every),
        values=sum(len(entry.values) for entry in entries.values()),
        files=len(manifest.files) + 1,
        file_bytes=manifest_bytes + sum(f.size for f in manifest.files.values()),
    )
    return Report(
        path=location.path(),
        step=manifest.step,
        created=manifest.created,
        library=dict(manifest.library),
        metrics=metrics,
        entries=list(entries.values()),
        aliases={name: alias.base for name, alias in manifest.aliases.items()},
        totals=totals,
    )


@click.command("inspect")
@click.argument("target", metavar="CKPT|URL")
@click.option(
    "--step", type=click.IntRange(min=0), help="Step of a run directory (default: newest)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def inspect(target: str, step: int | None, as_json: bool) -> None:
    """Show the state tree of a checkpoint: tensors, values, aliases, metrics.

    CKPT is a step directory or a run directory. Only the manifest is read (and verified);
    use `statekeeper verify` to check the tensor data too. CKPT may be an fsspec URL
    (s3://bucket/run/step_000000100). A checkpoint of another format
    (torch.save, safetensors, Hugging Face, Lightning, Accelerate, DCP) is read safely and
    its tensors and values are shown.
    """
    with render.reported_errors():
        foreign = foreign_format(target)
        if foreign is not None:
            if step is not None:
                render.fail(f"{target} is a {foreign[1]} checkpoint, which has no steps", 2)
            from statekeeper.interop.describe import describe  # foreign readers: torch

            description = describe(*foreign)
            if as_json:
                render.emit_json(description)  # a dataclass: emit_json makes it a dict
            else:
                render_interop.foreign_inspection(description)
            return
        if not is_url(target) and not Path(target).is_dir():
            render.fail(f"{target} is not a directory; pass a run directory or a step directory", 2)
        location = locate(target, step)
        report = build_report(location, read_manifest(location))
    if as_json:
        render.emit_json(report)
    else:
        render_inspect.inspection(report)
