"""What :func:`statekeeper.audit.inspect` returns for a foreign checkpoint: :class:`ForeignReport`
(torch-free, so that naming the type never imports the foreign readers).

Its tensor and value rows are the ones a statekeeper step's report has
(:class:`~statekeeper.catalog.inspection.TensorRow`,
:class:`~statekeeper.catalog.inspection.ValueRow`); a foreign checkpoint has no entries,
so a row's ``key`` is its full key path, as its ``name`` (``path``) is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from statekeeper.catalog.inspection import TensorRow, ValueRow

__all__ = ["FileRow", "ForeignReport"]


@dataclass(frozen=True)
class FileRow:
    """One file of a foreign checkpoint: its name (relative to the checkpoint), size and
    what it holds (``"weights"``, ``"index"``, ``"metadata"``, an Accelerate entry...)."""

    name: str
    bytes: int
    role: str


def _tensor_json(row: TensorRow) -> dict[str, Any]:
    shape = list(row.shape)
    return {"key": row.key, "shape": shape, "dtype": row.dtype, "bytes": row.bytes,
            "alias_of": row.alias_of}  # fmt: skip


@dataclass(frozen=True)
class ForeignReport:
    """What a foreign checkpoint holds: its files, tensors (key, shape, dtype, bytes,
    alias) and plain values."""

    path: str
    format: str
    files: list[FileRow]
    tensors: list[TensorRow]
    values: list[ValueRow]
    tensor_bytes: int
    file_bytes: int

    def to_json(self) -> dict[str, Any]:
        """The ``statekeeper inspect --json`` document: the rows with the columns a foreign
        checkpoint has (key, shape, dtype, bytes, alias_of; key, type, value).

        Returns:
            A JSON-able dict: ``path``, ``format``, the ``files``, ``tensors`` and ``values``
            rows, ``tensor_bytes`` and ``file_bytes``.
        """
        return {
            "path": self.path,
            "format": self.format,
            "files": [{"name": f.name, "bytes": f.bytes, "role": f.role} for f in self.files],
            "tensors": [_tensor_json(t) for t in self.tensors],
            "values": [{"key": v.key, "type": v.type, "value": v.value} for v in self.values],
            "tensor_bytes": self.tensor_bytes,
            "file_bytes": self.file_bytes,
        }
