"""Reading the tensors of one checkpoint one at a time (offline averaging streams them)."""

from __future__ import annotations

import mmap
import os
from typing import Any, BinaryIO

import torch
from safetensors import safe_open

from statekeeper.checkpoint.location import Location
from statekeeper.errors import CorruptCheckpointError, InvalidArgumentError
from statekeeper.format.checksum import matches
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.sharding import assemble
from statekeeper.format.tensors import dtype_name
from statekeeper.storage.local import LocalStorage

__all__ = ["Shards", "file_of"]


def file_of(manifest: Manifest, name: str) -> str:
    """The file that holds ``name`` (the first chunk's, for a sharded tensor)."""
    if manifest.sharding is not None and name in manifest.sharding.tensors:
        chunks = manifest.sharding.tensors[name].chunks
        if not chunks:  # an empty tensor: nothing to read
            return ""
        name = chunks[0].tensor
    return manifest.tensors[name].file


def _matches(f: BinaryIO, expected: str) -> bool:
    """``checksum.matches`` over a file mapped into memory, never read into the heap."""
    if os.fstat(f.fileno()).st_size == 0:
        return matches(b"", expected)
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m, memoryview(m) as view:
        return matches(view, expected)


class Shards:
    """Tensors of one checkpoint, one at a time; a shard is verified before its first use."""

    def __init__(self, location: Location, manifest: Manifest) -> None:
        storage = location.storage
        if not isinstance(storage, LocalStorage):
            raise InvalidArgumentError("average_checkpoints reads local checkpoints only")
        self._dir = storage.root / location.entry
        self._manifest = manifest
        self._file: str | None = None
        self._handle: Any = None
        self._verified: set[str] = set()  # checksummed once, however often reopened

    def _open(self, file: str) -> None:
        """Check ``file``'s size and checksum against the manifest (once), then open it."""
        self.close()
        path, record = str(self._dir / file), self._manifest.files.get(file)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                ok = file in self._verified or (
                    record is not None and size == record.size and _matches(f, record.checksum)
                )
        except FileNotFoundError:
            raise CorruptCheckpointError(path, "file listed in the manifest is missing") from None
        if not ok:
            expected = f"{record.size} bytes, {record.checksum}" if record else "no record"
            raise CorruptCheckpointError(path, f"size or checksum mismatch ({expected})")
        self._verified.add(file)
        try:
            self._handle = safe_open(path, framework="pt")
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise CorruptCheckpointError(path, f"not a valid safetensors file ({exc})") from None
        self._file = file

    def get(self, name: str) -> torch.Tensor:
        """A stored tensor, or a sharded one assembled from its chunks."""
        sharding = self._manifest.sharding
        if sharding is not None and name in sharding.tensors:
            try:
                return assemble(name, sharding.tensors[name], self._stored)
            except ValueError as exc:
                raise CorruptCheckpointError(str(self._dir / MANIFEST), str(exc)) from None
        return self._stored(name)

    def _stored(self, name: str) -> torch.Tensor:
        record = self._manifest.tensors[name]
        if record.file != self._file:
            self._open(record.file)
        try:
            t: torch.Tensor = self._handle.get_tensor(name)
        except Exception:  # absent from the shard: reported below
            t = torch.empty(0)
        if dtype_name(t.dtype) != record.dtype or tuple(t.shape) != record.shape:
            problem = f"tensor {name!r} is missing or differs from the manifest"
            raise CorruptCheckpointError(str(self._dir / record.file), problem)
        return t

    def close(self) -> None:
        if self._handle is not None:
            self._handle.__exit__(None, None, None)
        self._handle, self._file = None, None
