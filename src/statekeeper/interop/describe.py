"""What a foreign checkpoint holds, for ``statekeeper ls`` and ``inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from statekeeper.catalog.detect import Format
from statekeeper.catalog.foreign_files import size_of
from statekeeper.catalog.inspection import TensorRow, ValueRow
from statekeeper.format.aliases import tie_plan
from statekeeper.format.dtypes import dtype_name
from statekeeper.interop.accelerate import accelerate_files
from statekeeper.interop.foreign_report import FileRow, ForeignReport
from statekeeper.interop.reading import read_foreign
from statekeeper.interop.safetensors_files import hf_files, weight_map
from statekeeper.interop.tree import flat_leaves, split_tensors

__all__ = ["describe", "list_files"]

SHORT = 60


def _index_files(index: Path) -> list[Path]:
    names = dict.fromkeys(weight_map(index).values())  # checked: plain names beside the index
    return [index, *(index.parent / n for n in names)]


def _size(path: Path) -> int:
    """The size of a regular file (links followed); 0 when it is missing. Anything else (a
    FIFO, a device) is a ``CorruptCheckpointError``: it is never opened."""
    try:
        return size_of(path)
    except FileNotFoundError:
        return 0


def list_files(path: str, fmt: Format) -> list[FileRow]:
    """The files that make up the checkpoint, each with its size and role."""
    p = Path(path)
    rows: list[tuple[Path, str]] = []
    if fmt is Format.DCP:
        rows = [(p / ".metadata", "metadata")]
        rows += [(f, "data") for f in sorted(p.glob("*.distcp"))]
    elif fmt is Format.ACCELERATE:
        for entry, file in accelerate_files(p).items():
            files = _index_files(file) if file.name.endswith(".index.json") else [file]
            rows += [(f, entry) for f in files]
    elif fmt is Format.HUGGINGFACE:
        for file in hf_files(p) if p.is_dir() else [p]:
            if file.name.endswith(".index.json"):
                found = _index_files(file)
                rows += [(found[0], "index"), *((f, "weights") for f in found[1:])]
            else:
                rows.append((file, "weights"))
    else:
        rows = [(p, str(fmt))]
    base = p if p.is_dir() else p.parent
    return [
        FileRow(str(f.relative_to(base)) if f.is_relative_to(base) else str(f), _size(f), role)
        for f, role in rows
    ]  # fmt: skip


def _summary(value: Any) -> tuple[str, bool]:
    """The value's repr when short, else a summary; and whether it is the full repr."""
    text = repr(value)
    if len(text) <= SHORT:
        return text, True
    if isinstance(value, list | tuple):
        return f"<{type(value).__name__} of {len(value)}>", False
    return text[: SHORT - 3] + "...", False


def describe(path: str, fmt: Format) -> ForeignReport:
    """Files, tensors (name, shape, dtype, bytes, tied aliases) and plain values."""
    state = read_foreign(path, fmt)
    tensors, others = split_tensors(flat_leaves(state))
    values = [ValueRow(key, key, type(v).__name__, *_summary(v)) for key, v in others.items()]
    _, aliases = tie_plan(tensors)
    rows = [
        TensorRow(key, key, tuple(t.shape), dtype_name(t.dtype),
                  0 if key in aliases else t.numel() * t.element_size(), None, aliases.get(key))
        for key, t in tensors.items()
    ]  # fmt: skip
    files = list_files(path, fmt)
    return ForeignReport(
        path, str(fmt), files, rows, values,
        sum(r.bytes for r in rows), sum(f.bytes for f in files),
    )  # fmt: skip
