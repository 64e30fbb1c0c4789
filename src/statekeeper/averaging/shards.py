"""Reading the tensors of one checkpoint one at a time (offline averaging streams them)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from statekeeper.catalog.location import Location
from statekeeper.catalog.verifier import VerifiedReads
from statekeeper.catalog.verify_step import check_records, file_header
from statekeeper.checkpoint.reader import sharded_tensor
from statekeeper.errors import CorruptCheckpointError, InvalidArgumentError
from statekeeper.format.malformed import FormatError, corrupt
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.safetensors_header import Header
from statekeeper.format.safetensors_io import parse
from statekeeper.storage.optional import capabilities_of

__all__ = ["Shards", "file_of"]


def file_of(manifest: Manifest, name: str) -> str:
    """The file that holds ``name`` (the first chunk's, for a sharded tensor)."""
    if manifest.sharding is not None and name in manifest.sharding.tensors:
        chunks = manifest.sharding.tensors[name].chunks
        if not chunks:  # an empty tensor: nothing to read
            return ""
        name = chunks[0].tensor
    return manifest.tensors[name].file


class _Shard(NamedTuple):
    file: str
    header: Header
    tensors: dict[str, torch.Tensor]


class Shards:
    """Tensors of one checkpoint, one at a time; a shard is verified before its first use.

    A shard is read as every file of a step is (:mod:`statekeeper.catalog.verifier`):
    a regular file, never through a link, its size compared with the manifest's before a
    byte is read, its checksum verified the first time it is opened, then parsed (tensors
    are views of the storage's map). Only storages whose reads are local maps
    (``Capabilities.local_reads``) are read, so that a shard costs no memory until used.
    """

    def __init__(self, location: Location, manifest: Manifest) -> None:
        if not capabilities_of(location.storage).local_reads:
            raise InvalidArgumentError("average_checkpoints reads local checkpoints only")
        self._location = location
        self._manifest = manifest
        self._reads = VerifiedReads(location, manifest)
        self._shard: _Shard | None = None

    def _open(self, name: str, file: str) -> _Shard:
        """Verify ``file`` (once) and map it; ``name`` is the tensor that asks for it."""
        self.close()
        if file not in self._manifest.files:
            raise CorruptCheckpointError(
                self._location.path(MANIFEST), f"tensor {name!r} is in unlisted file {file!r}"
            )
        data = self._reads.read(file)
        header = file_header(self._location, file, data)
        try:
            tensors = parse(data, header)
        except FormatError as exc:
            where = self._location.path(file)
            raise corrupt(where, exc, "not a valid safetensors file: {}") from exc
        self._shard = _Shard(file, header, tensors)
        return self._shard

    def get(self, name: str) -> torch.Tensor:
        """A stored tensor, or a sharded one assembled from its chunks."""
        sharding = self._manifest.sharding
        if sharding is not None and name in sharding.tensors:
            return sharded_tensor(self._location, name, sharding.tensors[name], self._stored)
        return self._stored(name)

    def _stored(self, name: str) -> torch.Tensor:
        file = self._manifest.tensors[name].file
        shard = self._shard
        if shard is None or shard.file != file:
            shard = self._open(name, file)
        check_records(self._location, self._manifest, file, shard.header, [name])
        return shard.tensors[name]

    def close(self) -> None:
        """Drop this reader's views of the current shard (tensors handed out stay valid)."""
        self._shard = None
