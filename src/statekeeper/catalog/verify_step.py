"""Verifying one committed step without building a tensor: ``statekeeper verify``.

Every check :func:`~statekeeper.checkpoint.reader.read_step` makes before it hands out a
state, made on records instead of tensors, so that verifying needs no torch (and starts in
a fraction of a second): the manifest (self-checksum, names, aliases; see
:mod:`statekeeper.format.manifest`), each file's size and checksum, each safetensors header
parsed strictly (:func:`~statekeeper.format.safetensors_header.read_header`) and every
tensor record compared with it (dtype and shape), the chunks of each sharded tensor tiling
it, and every tensor reference of the state resolving to a stored tensor, an alias or a
sharded tensor. Raises ``CorruptCheckpointError`` (or ``UnsupportedFormatError``,
``StepNotFoundError`` for a step deleted meanwhile) for the first problem.
"""

from __future__ import annotations

from statekeeper.catalog.location import Location
from statekeeper.catalog.manifests import read_manifest
from statekeeper.catalog.verifier import Progress, Verifier
from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.checksum import Buffer
from statekeeper.format.dtypes import CODE_OF
from statekeeper.format.malformed import FormatError, corrupt
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.safetensors_header import Header, read_header
from statekeeper.format.sharding import tiling_problem
from statekeeper.format.values_decode import decode_value

__all__ = ["check_records", "file_header", "tensors_by_file", "verify_step"]


def tensors_by_file(location: Location, manifest: Manifest) -> dict[str, list[str]]:
    """The names of the tensors each file holds; a record naming an unlisted file is damage."""
    by_file: dict[str, list[str]] = {}
    for name, rec in manifest.tensors.items():
        if rec.file not in manifest.files:
            raise CorruptCheckpointError(
                location.path(MANIFEST), f"tensor {name!r} is in unlisted file {rec.file!r}"
            )
        by_file.setdefault(rec.file, []).append(name)
    return by_file


def file_header(location: Location, file: str, data: Buffer) -> Header:
    """The checked header of the step's safetensors file ``file`` held in ``data``."""
    try:
        return read_header(memoryview(data))
    except FormatError as exc:
        raise corrupt(location.path(file), exc, "not a valid safetensors file: {}") from exc


def check_records(
    location: Location, manifest: Manifest, file: str, header: Header, names: list[str]
) -> None:
    """Each tensor ``names`` lists is in ``header`` with the dtype and shape the manifest
    records; the first that is not is a ``CorruptCheckpointError`` naming ``file``."""
    entries, records = header.entries, manifest.tensors
    for name in names:
        rec, entry = records[name], entries.get(name)
        if entry is None or entry.code != CODE_OF.get(rec.dtype) or tuple(entry.shape) != rec.shape:
            raise CorruptCheckpointError(
                location.path(file), f"tensor {name!r} is missing or differs from the manifest"
            )


def _shape_of(manifest: Manifest, name: str) -> tuple[int, ...]:
    if name in manifest.tensors:
        return manifest.tensors[name].shape
    if name in manifest.aliases:
        return manifest.aliases[name].shape
    raise FormatError(f"reference to unknown tensor {name!r}", key=name)


def _dtype_of(manifest: Manifest, name: str) -> str:
    base = manifest.aliases[name].base if name in manifest.aliases else name
    return manifest.tensors[base].dtype


def _check_structure(location: Location, manifest: Manifest) -> None:
    where = location.path(MANIFEST)
    sharded = manifest.sharding.tensors if manifest.sharding is not None else {}
    for name, record in sharded.items():
        try:
            boxes = [(c.offsets, _shape_of(manifest, c.tensor)) for c in record.chunks]
            if any(_dtype_of(manifest, c.tensor) != record.dtype for c in record.chunks):
                raise FormatError("a chunk has another dtype")
        except FormatError as exc:
            raise corrupt(where, exc, f"sharded tensor {name!r}: {{}}") from exc
        problem = tiling_problem(record.shape, boxes)
        if problem is not None:
            raise CorruptCheckpointError(where, f"sharded tensor {name!r}: the chunks {problem}")

    def on_ref(tag: str, name: str) -> None:
        if name not in manifest.tensors and name not in manifest.aliases and name not in sharded:
            raise FormatError(f"reference to unknown tensor {name!r}", key=name)

    skeletons = [manifest.state, *(manifest.sharding.ranks if manifest.sharding else [])]
    for skeleton in skeletons:
        try:
            decode_value(skeleton, "", on_ref)
        except FormatError as exc:
            raise corrupt(where, exc, "state is malformed: {}") from exc
        if not isinstance(skeleton, dict):
            raise CorruptCheckpointError(where, "state is not a mapping")


def verify_step(location: Location, progress: Progress | None = None) -> Manifest:
    """Check one committed step completely (see the module docstring); its manifest."""
    manifest = read_manifest(location)
    if location.step >= 0 and manifest.step != location.step:
        raise CorruptCheckpointError(
            location.path(MANIFEST), f"manifest is for step {manifest.step}, not {location.step}"
        )
    by_file = tensors_by_file(location, manifest)
    verifier = Verifier(location)
    try:
        opened = {file: verifier.open(manifest, file) for file in sorted(manifest.files)}
        verifier.check(manifest, progress)  # every checksum first: damage is named as such
        for file, data in opened.items():
            if file.endswith(".safetensors") or file in by_file:
                header = file_header(location, file, data)
                check_records(location, manifest, file, header, by_file.get(file, []))
    finally:
        verifier.close()
    _check_structure(location, manifest)
    return manifest
