"""Reading a step's manifest: size-capped, self-verified, a deleted step told from a damaged
one. No torch here: listing a run (``statekeeper ls``) reads manifests only."""

from __future__ import annotations

from statekeeper.catalog.location import Location
from statekeeper.catalog.verifier import missing
from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.jsondoc import MAX_MANIFEST_BYTES
from statekeeper.format.manifest import MANIFEST, Manifest

__all__ = ["read_manifest"]


def read_manifest(location: Location) -> Manifest:
    """The step's parsed, self-verified manifest. ``StepNotFoundError`` when the step was
    deleted meanwhile; ``CorruptCheckpointError`` when it is missing, too large, or bad."""
    for again in (False, True):  # once more where the step was renamed meanwhile
        path = location.path(MANIFEST)
        storage, entry = location.storage, location.entry
        try:
            size = storage.size(entry, MANIFEST)
            if size > MAX_MANIFEST_BYTES:
                raise CorruptCheckpointError(
                    path, f"manifest is {size} bytes, over the {MAX_MANIFEST_BYTES}-byte limit"
                )
            data = storage.read(entry, MANIFEST)
            break
        except FileNotFoundError as exc:
            if again or not location.relocate():
                raise missing(location, MANIFEST) from exc
    return Manifest.from_bytes(path, bytes(data))
