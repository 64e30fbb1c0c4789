"""Reading the tensors of one checkpoint one at a time (offline averaging streams them)."""

from __future__ import annotations

import mmap
import os

import torch

from statekeeper.checkpoint.location import Location
from statekeeper.errors import CorruptCheckpointError, InvalidArgumentError
from statekeeper.format.checksum import matches
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.safetensors_io import parse
from statekeeper.format.sharding import assemble
from statekeeper.format.tensors import dtype_name
from statekeeper.storage.files import check_name, open_regular
from statekeeper.storage.local import LocalStorage

__all__ = ["Shards", "file_of"]

_ABSENT = torch.empty(0)


def file_of(manifest: Manifest, name: str) -> str:
    """The file that holds ``name`` (the first chunk's, for a sharded tensor)."""
    if manifest.sharding is not None and name in manifest.sharding.tensors:
        chunks = manifest.sharding.tensors[name].chunks
        if not chunks:  # an empty tensor: nothing to read
            return ""
        name = chunks[0].tensor
    return manifest.tensors[name].file


def _matches(fd: int, size: int, expected: str) -> bool:
    """``checksum.matches`` over a file mapped into memory, never read into the heap."""
    if size == 0:
        return matches(b"", expected)
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as m, memoryview(m) as view:
        return matches(view, expected)


class Shards:
    """Tensors of one checkpoint, one at a time; a shard is verified before its first use.

    A shard is opened as statekeeper opens every file of its own steps: a regular file, not
    a link (:func:`~statekeeper.storage.files.open_regular`), its size compared with the
    manifest's before a byte is read, then mapped copy-on-write and parsed by
    :func:`~statekeeper.format.safetensors_io.parse` (tensors are views of the map).
    """

    def __init__(self, location: Location, manifest: Manifest) -> None:
        storage = location.storage
        if not isinstance(storage, LocalStorage):
            raise InvalidArgumentError("average_checkpoints reads local checkpoints only")
        self._dir = storage.root / location.entry
        self._manifest = manifest
        self._file: str | None = None
        self._tensors: dict[str, torch.Tensor] = {}
        self._verified: set[str] = set()  # checksummed once, however often reopened

    def _open(self, file: str) -> None:
        """Check ``file``'s size and checksum against the manifest (once), then map it."""
        self.close()
        check_name(str(self._dir / MANIFEST), file)
        path, record = str(self._dir / file), self._manifest.files.get(file)
        if record is None:
            raise CorruptCheckpointError(path, "size or checksum mismatch (no record)")
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            raise CorruptCheckpointError(path, "file listed in the manifest is missing") from None
        try:
            size = os.fstat(fd).st_size
            ok = size == record.size and (
                file in self._verified or _matches(fd, size, record.checksum)
            )
            if not ok:
                problem = f"size or checksum mismatch ({record.size} bytes, {record.checksum})"
                raise CorruptCheckpointError(path, problem)
            data = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else b""
        finally:
            os.close(fd)
        self._verified.add(file)
        try:
            self._tensors = parse(data)
        except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
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
        t = self._tensors.get(name, _ABSENT)
        if dtype_name(t.dtype) != record.dtype or tuple(t.shape) != record.shape:
            problem = f"tensor {name!r} is missing or differs from the manifest"
            raise CorruptCheckpointError(str(self._dir / record.file), problem)
        return t

    def close(self) -> None:
        """Drop this reader's views of the current shard (tensors handed out stay valid)."""
        self._tensors, self._file = {}, None
