"""The stored tensors of one step, each file read and verified the first time it is needed.

A rank loading a sharded step reads only the files that hold chunks it needs (and its own
per-rank file); each is checked against the manifest's size and checksum before any of its
tensors is used (:class:`~statekeeper.checkpoint.verifier.VerifiedReads`).
"""

from __future__ import annotations

import torch

from statekeeper.checkpoint.location import Location
from statekeeper.checkpoint.reader import alias_tensor, file_tensors, sharded_tensor
from statekeeper.checkpoint.verifier import VerifiedReads
from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.sharding import Chunk, ShardedRecord

__all__ = ["VerifiedFiles"]


class VerifiedFiles:
    def __init__(self, location: Location, manifest: Manifest) -> None:
        self.location = location
        self.manifest = manifest
        self._files: dict[str, dict[str, torch.Tensor]] = {}
        self._reads = VerifiedReads(location, manifest)

    def verify_share(self, rank: int, world: int) -> None:
        """Verify (size, checksum) every ``world``-th file, starting at ``rank``. Once every rank
        has done its share, and all agreed, every file is known intact: :meth:`mark_checked`."""
        for i, name in enumerate(sorted(self.manifest.files)):
            if i % world == rank:
                self._reads.verify(name)

    def mark_checked(self) -> None:
        self._reads.trust_all()

    def tensor(self, name: str) -> torch.Tensor:
        """A stored tensor (or a sharded one, assembled) by its manifest name."""
        sharding = self.manifest.sharding
        if sharding is not None and name in sharding.tensors:
            return sharded_tensor(self.location, name, sharding.tensors[name], self.tensor)
        alias = self.manifest.aliases.get(name)
        if alias is not None:
            return alias_tensor(self.location, name, alias, self.tensor(alias.base))
        record = self.manifest.tensors.get(name)
        if record is None or record.file not in self.manifest.files:
            raise CorruptCheckpointError(
                self.location.path(MANIFEST), f"tensor {name!r} is not listed in a stored file"
            )
        if record.file not in self._files:
            data = self._reads.read(record.file)
            names = [n for n, r in self.manifest.tensors.items() if r.file == record.file]
            self._files[record.file] = file_tensors(
                self.location, self.manifest, record.file, data, names
            )
        return self._files[record.file][name]

    def shape(self, name: str) -> tuple[int, ...]:
        """A stored tensor's shape, from the manifest (nothing is read)."""
        record = self.manifest.tensors.get(name)
        if record is not None:
            return record.shape
        alias = self.manifest.aliases.get(name)
        if alias is not None:
            return alias.shape
        raise CorruptCheckpointError(
            self.location.path(MANIFEST), f"tensor {name!r} is not listed in a stored file"
        )

    def records(self) -> dict[str, ShardedRecord]:
        """Every global tensor as chunks: a version-1 step's tensors are one chunk each."""
        if self.manifest.sharding is not None:
            return dict(self.manifest.sharding.tensors)
        out = {
            name: ShardedRecord(rec.dtype, rec.shape, (Chunk(name, (0,) * len(rec.shape)),))
            for name, rec in self.manifest.tensors.items()
        }
        for name, alias in self.manifest.aliases.items():
            base = self.manifest.tensors.get(alias.base)
            if base is not None:
                out[name] = ShardedRecord(
                    base.dtype, alias.shape, (Chunk(name, (0,) * len(alias.shape)),)
                )
        return out
