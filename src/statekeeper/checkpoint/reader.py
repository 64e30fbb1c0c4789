"""Reading one committed step with every byte verified before anything is returned."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from statekeeper.checkpoint.location import Location
from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.aliases import rebuild_alias
from statekeeper.format.checksum import Buffer, matches
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.safetensors_io import parse
from statekeeper.format.tensors import dtype_name
from statekeeper.state.tree import unflatten

__all__ = ["Progress", "VerifiedStep", "read_manifest", "read_step"]

Progress = Callable[[int, int], None]
"""Called as ``progress(done_bytes, total_bytes)`` while files are read."""


@dataclass(frozen=True)
class VerifiedStep:
    """A step whose files all passed their checks: its manifest and decoded state."""

    location: Location
    manifest: Manifest
    state: dict[str, Any]


def read_manifest(location: Location) -> Manifest:
    path = location.path(MANIFEST)
    try:
        data = location.storage.read(location.entry, MANIFEST)
    except FileNotFoundError:
        raise CorruptCheckpointError(path, "manifest.json is missing") from None
    return Manifest.from_bytes(path, bytes(data))


def _read_file(location: Location, manifest: Manifest, name: str) -> Buffer:
    path = location.path(name)
    record = manifest.files[name]
    try:
        data = location.storage.read(location.entry, name)
    except FileNotFoundError:
        raise CorruptCheckpointError(path, "file listed in the manifest is missing") from None
    if len(data) != record.size:
        raise CorruptCheckpointError(
            path, f"size is {len(data)} bytes, the manifest says {record.size}"
        )
    if not matches(data, record.checksum):
        raise CorruptCheckpointError(path, f"checksum mismatch (expected {record.checksum})")
    return data


def _load_tensors(
    location: Location, manifest: Manifest, progress: Progress | None
) -> dict[str, torch.Tensor]:
    by_file: dict[str, list[str]] = {}
    for name, rec in manifest.tensors.items():
        if rec.file not in manifest.files:
            raise CorruptCheckpointError(
                location.path(MANIFEST), f"tensor {name!r} is in unlisted file {rec.file!r}"
            )
        by_file.setdefault(rec.file, []).append(name)
    total = sum(r.size for r in manifest.files.values())
    done = 0
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(manifest.files):
        data = _read_file(location, manifest, file)
        try:
            loaded = parse(data)
        except ValueError as exc:
            raise CorruptCheckpointError(
                location.path(file), f"not a valid safetensors file: {exc}"
            ) from None
        for name in by_file.get(file, []):
            rec = manifest.tensors[name]
            t = loaded.get(name)
            if t is None or dtype_name(t.dtype) != rec.dtype or tuple(t.shape) != rec.shape:
                raise CorruptCheckpointError(
                    location.path(file), f"tensor {name!r} is missing or differs from the manifest"
                )
            tensors[name] = t
        done += manifest.files[file].size
        if progress is not None:
            progress(done, total)
    for name, alias in manifest.aliases.items():
        base = tensors.get(alias.base)
        if base is None or name in tensors:
            raise CorruptCheckpointError(
                location.path(MANIFEST), f"alias {name!r} has no stored base"
            )
        try:
            tensors[name] = rebuild_alias(base, alias)
        except ValueError as exc:
            raise CorruptCheckpointError(location.path(MANIFEST), str(exc)) from None
    return tensors


def read_step(location: Location, progress: Progress | None = None) -> VerifiedStep:
    """Read, verify and decode one committed step; raises only statekeeper errors."""
    manifest = read_manifest(location)
    if location.step >= 0 and manifest.step != location.step:
        raise CorruptCheckpointError(
            location.path(MANIFEST), f"manifest is for step {manifest.step}, not {location.step}"
        )
    tensors = _load_tensors(location, manifest, progress)

    def lookup(name: str) -> torch.Tensor:
        try:
            return tensors[name]
        except KeyError:
            raise ValueError(f"reference to unknown tensor {name!r}") from None

    try:
        state = unflatten(manifest.state, lookup)
    except (ValueError, TypeError, RuntimeError) as exc:  # only a crafted manifest gets here
        raise CorruptCheckpointError(
            location.path(MANIFEST), f"state is malformed: {exc}"
        ) from None
    if not isinstance(state, dict):
        raise CorruptCheckpointError(location.path(MANIFEST), "state is not a mapping")
    return VerifiedStep(location, manifest, state)
