"""Reading one committed step with every byte verified before anything is returned."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from statekeeper.catalog.location import Location
from statekeeper.catalog.manifests import read_manifest
from statekeeper.catalog.verifier import Progress, Verifier
from statekeeper.catalog.verify_step import check_records, file_header, tensors_by_file
from statekeeper.checkpoint.origin import warn_if_other_torch
from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.aliases import Alias, rebuild_alias
from statekeeper.format.checksum import Buffer
from statekeeper.format.malformed import FormatError, corrupt
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.safetensors_io import parse
from statekeeper.format.sharding import ShardedRecord, assemble
from statekeeper.state.tree import unflatten

__all__ = [
    "PendingStep",
    "Progress",
    "VerifiedStep",
    "alias_tensor",
    "file_tensors",
    "read_manifest",
    "read_step",
    "sharded_tensor",
]


@dataclass(frozen=True)
class VerifiedStep:
    """A step whose files all passed their checks: its manifest and decoded state."""

    location: Location
    manifest: Manifest
    state: dict[str, Any]


def file_tensors(
    location: Location, manifest: Manifest, file: str, data: Buffer, names: list[str]
) -> dict[str, torch.Tensor]:
    """The tensors ``names`` of the step's file ``file`` (held in ``data``, not necessarily
    verified yet), after checking them against the manifest (dtype and shape)."""
    header = file_header(location, file, data)
    check_records(location, manifest, file, header, names)
    loaded = parse(data, header)
    return {name: loaded[name] for name in names}


def alias_tensor(location: Location, name: str, alias: Alias, base: torch.Tensor) -> torch.Tensor:
    """The alias ``name``, a view of its stored ``base``; a view that the base cannot hold
    is damage, named in the manifest."""
    try:
        return rebuild_alias(base, alias, name=name)
    except FormatError as exc:
        raise corrupt(location.path(MANIFEST), exc) from exc


def sharded_tensor(
    location: Location, name: str, record: ShardedRecord, chunk: Callable[[str], torch.Tensor]
) -> torch.Tensor:
    """The sharded tensor ``name`` assembled from its chunks (``chunk`` gives each stored
    one); chunks that do not tile it are damage, named in the manifest."""
    try:
        return assemble(name, record, chunk)
    except FormatError as exc:
        raise corrupt(location.path(MANIFEST), exc, f"sharded tensor {name!r}: {{}}") from exc


def _load_tensors(
    location: Location, manifest: Manifest, verifier: Verifier
) -> dict[str, torch.Tensor]:
    """Every tensor, decoded while ``verifier`` checksums the files (not yet confirmed)."""
    by_file = tensors_by_file(location, manifest)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(manifest.files):
        data = verifier.open(manifest, file)
        tensors.update(file_tensors(location, manifest, file, data, by_file.get(file, [])))
    for name, alias in manifest.aliases.items():
        base = tensors.get(alias.base)
        if base is None or name in tensors:
            raise CorruptCheckpointError(
                location.path(MANIFEST), f"alias {name!r} has no stored base"
            )
        tensors[name] = alias_tensor(location, name, alias, base)
    if manifest.sharding is not None:  # a sharded step: each global tensor from its chunks
        for name, record in manifest.sharding.tensors.items():
            tensors[name] = sharded_tensor(location, name, record, _lookup(tensors))
    return tensors


def _lookup(tensors: dict[str, torch.Tensor]) -> Callable[[str], torch.Tensor]:
    def lookup(name: str) -> torch.Tensor:
        try:
            return tensors[name]
        except KeyError:  # the message names the tensor: the KeyError adds nothing
            raise FormatError(f"reference to unknown tensor {name!r}", key=name) from None

    return lookup


def _decode(
    location: Location, manifest: Manifest, tensors: dict[str, torch.Tensor], rank: int
) -> dict[str, Any]:
    """The nested state; of a sharded step, with the per-rank entries of ``rank`` (when the
    saving job had that rank)."""
    skeletons = [manifest.state]
    if manifest.sharding is not None and 0 <= rank < len(manifest.sharding.ranks):
        skeletons.append(manifest.sharding.ranks[rank])
    state: dict[str, Any] = {}
    for skeleton in skeletons:
        try:
            part = unflatten(skeleton, _lookup(tensors))
        except FormatError as exc:  # only a crafted manifest
            raise corrupt(location.path(MANIFEST), exc, "state is malformed: {}") from exc
        if not isinstance(part, dict):
            raise CorruptCheckpointError(location.path(MANIFEST), "state is not a mapping")
        state.update(part)
    return state


class PendingStep:
    """A step whose state is decoded while its checksums are still being computed.

    Use it as a context manager; nothing of ``state`` may reach a live object before
    ``verify()`` has returned. The time between is for work that only inspects the state
    (key, shape and dtype checks; planning the copies), so that it overlaps the hashing.
    """

    def __init__(self, location: Location, rank: int = 0) -> None:
        self.location = location
        self._verifier = Verifier(location)
        try:
            self._verifier.start_early()
            self.manifest = manifest = read_manifest(location)
            warn_if_other_torch(manifest.library, location.path())
            if location.step >= 0 and manifest.step != location.step:
                raise CorruptCheckpointError(
                    location.path(MANIFEST),
                    f"manifest is for step {manifest.step}, not {location.step}",
                )
            try:
                tensors = _load_tensors(location, manifest, self._verifier)
                self.state = _decode(location, manifest, tensors, rank)
            except CorruptCheckpointError:
                self._verifier.check(manifest)  # a bad checksum of a file read so far comes first
                raise
        except BaseException:
            self._verifier.close()
            raise

    def verify(self, progress: Progress | None = None) -> VerifiedStep:
        """Wait for every checksum; raise ``CorruptCheckpointError`` for the first bad file."""
        try:
            self._verifier.check(self.manifest, progress)
        finally:
            self._verifier.close()
        return VerifiedStep(self.location, self.manifest, self.state)

    def __enter__(self) -> PendingStep:
        return self

    def __exit__(self, *exc: object) -> None:
        self._verifier.close()


def read_step(location: Location, progress: Progress | None = None, rank: int = 0) -> VerifiedStep:
    """Read, verify and decode one committed step; raises only statekeeper errors.

    A sharded step (saved by several processes) is read whole, with the per-rank entries
    that rank ``rank`` saved.

    Files are decoded while their checksums are computed, but nothing is returned (and no
    error other than the first bad checksum is raised) before every checksum has passed.
    """
    with PendingStep(location, rank) as pending:
        return pending.verify(progress)
