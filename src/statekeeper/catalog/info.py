"""What save, load and listing report back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from statekeeper.format.malformed import FormatError, corrupt
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.values_decode import decode_value

__all__ = ["CheckpointInfo", "RestoreInfo"]


def _no_ref(tag: str, name: str) -> Any:
    raise FormatError(f"metrics cannot reference tensor {name!r}", key=name)


@dataclass(frozen=True)
class CheckpointInfo:
    """One committed step: where it is, how big, when it was made, its metrics.

    ``written`` is what its save wrote: ``bytes`` less the files it reused from an earlier
    step (incremental saves). ``error`` is set (and the other fields may be empty) when its
    manifest cannot be read.

    Attributes:
        step: The step number.
        path: The step directory (a path or URL).
        bytes: The step's size: every file it holds.
        created: When it was committed (from its manifest).
        metrics: The metrics saved with it.
        files: How many files it holds.
        error: Why its manifest cannot be read, or ``None``.
        written: The bytes its save wrote.
        reused_files: The files its save reused from an earlier step.
        library: The versions of the libraries that wrote it, by name.
        origin: Where it was written (host, command line, git), as ``Origin`` allowed.
    """

    step: int
    path: str
    bytes: int
    created: datetime | None
    metrics: dict[str, float | int] = field(default_factory=dict)
    files: int = 0
    error: str | None = None
    written: int = 0
    reused_files: int = 0
    library: dict[str, str] = field(default_factory=dict)  # the versions that wrote it
    origin: dict[str, Any] = field(default_factory=dict)  # host, command line, git...

    @classmethod
    def from_manifest(cls, path: str, manifest: Manifest, manifest_bytes: int) -> CheckpointInfo:
        created: datetime | None
        try:
            created = datetime.fromisoformat(manifest.created)
        except ValueError:
            created = None
        try:
            metrics = {k: decode_value(v, k, _no_ref) for k, v in manifest.metrics.items()}
        except FormatError as exc:  # a crafted manifest: its self-checksum matched
            raise corrupt(f"{path}/{MANIFEST}", exc, "metrics are malformed: {}") from exc
        return cls(
            step=manifest.step,
            path=path,
            bytes=manifest_bytes + sum(f.size for f in manifest.files.values()),
            created=created,
            metrics=metrics,
            files=len(manifest.files) + 1,
            written=manifest_bytes + manifest.written_bytes(),
            reused_files=len(manifest.reused),
            library=dict(manifest.library),
            origin=dict(manifest.origin),
        )


@dataclass(frozen=True)
class RestoreInfo:
    """What ``load`` restored: the step, where from, and the plain values it assigned.

    ``values`` holds the loaded value of every entry whose live object is immutable (an int,
    a str, a tuple...); ``load`` has assigned each into the state mapping it was given.
    ``replaced`` names live tensors that overlapped themselves (``expand``) and were replaced.

    Attributes:
        step: The step loaded.
        path: The step directory it was loaded from.
        values: The plain values assigned into the state mapping, by name.
        replaced: The names of the live tensors that were replaced instead of filled.
    """

    step: int
    path: str
    values: dict[str, Any] = field(default_factory=dict)
    replaced: tuple[str, ...] = ()
