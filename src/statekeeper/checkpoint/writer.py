"""Writing one step: ``prepare`` (flatten, share, encode: in the caller) and ``commit``
(stream the shards, write the manifest, commit: in the caller or a background thread)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import wait
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from statekeeper.arguments import require_mapping
from statekeeper.catalog.info import CheckpointInfo
from statekeeper.catalog.location import committed, validate_step
from statekeeper.catalog.naming import step_entry
from statekeeper.checkpoint.gc_pause import collector_paused
from statekeeper.checkpoint.independence import link_source
from statekeeper.checkpoint.options import Provenance, SaveOptions
from statekeeper.checkpoint.plan_cache import Plan, PlanCache
from statekeeper.checkpoint.points import Point, reach
from statekeeper.errors import (
    InvalidArgumentError,
    StatekeeperError,
    StepExistsError,
    StorageError,
)
from statekeeper.format.aliases import Alias, plan_sharing
from statekeeper.format.checksum import Hasher
from statekeeper.format.dtypes import dtype_name
from statekeeper.format.manifest import MANIFEST, FileRecord, Manifest, TensorRecord
from statekeeper.format.safetensors_io import ShardLayout, layout, stream
from statekeeper.format.tensors import plan_shards
from statekeeper.format.values import Json, encode_value
from statekeeper.incremental.reuse import Incremental, Reuser
from statekeeper.lanes import lane
from statekeeper.state.tree import flatten
from statekeeper.storage.base import FileWriter, Storage, Transaction

__all__ = [
    "METRICS",
    "Prepared",
    "check_step",
    "commit",
    "encode_metrics",
    "metric_items",
    "prepare",
    "write_shard",
    "write_step",
]

HASH_IN_THREAD_FROM = 1 << 20  # smaller chunks are hashed inline (0: always in the thread)


@dataclass(frozen=True)
class Prepared:
    """A captured state ready to write: JSON skeleton, tensors to store, aliases, metrics."""

    skeleton: Json
    stored: dict[str, torch.Tensor]
    aliases: dict[str, Alias]
    metrics: dict[str, Json]
    plan: Plan | None = None  # set when reusable: the same Plan means the same tensor layout


METRICS = "str names to numbers, e.g. {'val_loss': 0.25}"


def metric_items(metrics: Mapping[str, Any] | None) -> Iterator[tuple[str, Any]]:
    """Each metric as a Python number where it is one in another form: a one-element tensor
    or a numpy scalar becomes its ``.item()`` (``InvalidArgumentTypeError`` unless
    ``metrics`` is a mapping)."""
    require_mapping("metrics", metrics, METRICS, optional=True)
    for key, value in (metrics or {}).items():
        one = isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_meta
        if one or (isinstance(value, np.generic) and value.dtype.kind in "iuf"):
            value = value.item()
        yield key, value


def encode_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Json]:
    out: dict[str, Json] = {}
    for key, value in metric_items(metrics):
        if (
            not isinstance(key, str)
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise InvalidArgumentError(
                f"metric {key!r}={value!r}: metrics map str names to numbers"
            )
        out[key] = encode_value(value, key, _no_tensor)
    return out


def _no_tensor(path: str, value: Any) -> Json:
    raise InvalidArgumentError(f"metric {path!r} must be a number, not a tensor")


def prepare(
    captured: dict[str, Any],
    metrics: Mapping[str, Any] | None = None,
    cache: PlanCache | None = None,
) -> Prepared:
    """Flatten and plan a captured state (no copies of tensor data); with ``cache``, reuse
    the plan of an earlier state of the same structure (see :mod:`.plan_cache`)."""
    if cache is not None:
        skeleton, stored, aliases, plan = cache.plan(captured)
        return Prepared(skeleton, stored, aliases, encode_metrics(metrics), plan)
    flat = flatten(captured)
    sharing = plan_sharing(flat.tensors)
    return Prepared(flat.skeleton, sharing.stored, sharing.aliases, encode_metrics(metrics))


def check_step(storage: Storage, step: int, overwrite: bool) -> bool:
    """Whether ``step`` exists (to be replaced); StepExistsError unless ``overwrite``."""
    entry = step_entry(validate_step(step))
    exists = any(p.step == step for p in committed(storage))
    if exists and not overwrite:
        raise StepExistsError(
            f"{storage.describe(entry)} is already committed; pass overwrite=True to replace it "
            "or save under another step",
            path=storage.describe(entry),
        )
    return exists


def _hashed(chunks: Iterator[bytes | memoryview], hasher: Hasher) -> Iterator[bytes | memoryview]:
    """``chunks``, each hashed in a worker thread while the consumer writes it.

    xxhash releases the GIL, so the checksum (about 0.09 s per GiB) hides behind the writes:
    ``bench/io.py``'s durable-save row, 1 GiB, 5 interleaved rounds, the same run with
    ``HASH_IN_THREAD_FROM`` set past every chunk: 2.16 s median in the thread, 2.24 s inline
    (both without early write-back). A chunk's hash is finished before the next chunk is
    produced, as :func:`stream` reuses its staging buffer.
    """
    pool = lane("hash")  # long-lived: a thread ending at a fork can hang the child (lanes.py)
    for chunk in chunks:
        if memoryview(chunk).nbytes < HASH_IN_THREAD_FROM:
            hasher.update(chunk)
            yield chunk
            continue
        hashed = pool.submit(hasher.update, chunk)
        try:
            yield chunk
        finally:
            try:
                hashed.result()
            except BaseException:  # an interrupt here: the job still reads the chunk
                wait([hashed])
                raise


def write_shard(
    files: FileWriter,
    file: str,
    tensors: dict[str, torch.Tensor],
    shard: ShardLayout | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> FileRecord:
    """Stream ``tensors`` as the safetensors file ``file`` (checksummed while it is written)
    and return its record; ``on_chunk(nbytes)`` follows the writes."""
    hasher = Hasher()
    chunks = _hashed(stream(tensors, shard or layout(tensors)), hasher)

    def counted() -> Iterator[bytes | memoryview]:
        for chunk in chunks:
            yield chunk
            if on_chunk is not None:
                on_chunk(memoryview(chunk).nbytes)

    files.write_chunks(file, counted() if on_chunk is not None else chunks)
    return FileRecord(hasher.size, hasher.hexdigest())


_WRAPPED: tuple[type[BaseException], ...] = (StorageError,)


def _save_failed(storage: Storage, step: int, total: int, exc: OSError) -> StorageError:
    """``StorageError`` (errno kept) naming the run, the step, what failed and the bytes the
    step needs; the in-progress entry is gone and committed steps were not touched."""
    return StorageError(
        exc.errno,
        f"saving step {step} into {storage.describe()} failed: {exc.strerror or exc}. The "
        f"step needs {total} bytes for its tensor files plus its manifest; nothing was "
        "committed and earlier steps are intact",
    )


def commit(
    storage: Storage, prepared: Prepared, *, step: int, options: SaveOptions
) -> CheckpointInfo:
    """Stream the shards, write the manifest last, commit. The caller holds the writer lock.

    ``options.progress(done, total)`` is called with the bytes of the shards written so far."""
    progress = options.progress
    exists = check_step(storage, step, options.overwrite)
    entry = step_entry(step)
    files: dict[str, FileRecord] = {}
    tensors: dict[str, TensorRecord] = {}
    names: dict[torch.dtype, str] = {}  # dtype names, looked up once per dtype
    planned = [
        (shard.file, members, layout(members))
        for shard in plan_shards(
            prepared.stored, options.frozen, options.shard_bytes, options.steady
        )
        for members in ({n: prepared.stored[n] for n in shard.names},)
    ]
    total = sum(lay.size for _, _, lay in planned)
    written = 0

    def count(nbytes: int) -> None:
        nonlocal written
        written += nbytes
        if progress is not None:
            progress(written, total)

    txn: Transaction | None = None
    try:
        txn = storage.begin(entry, replace=exists)
        reach(Point.BEGUN)
        mode = options.incremental
        previous = (
            None
            if mode is Incremental.WRITE_ALL
            else link_source(storage, step, options.retention, prepared.metrics)
        )
        shared = {alias.base for alias in prepared.aliases.values()}
        trust = mode is Incremental.TRUST_MARKS
        reuser = Reuser(storage, txn, previous, options.marks, options.cache, shared, trust)
        for file, members, lay in planned:
            record = reuser.try_reuse(file, members, lay)
            if record is None:
                record = write_shard(txn, file, members, lay, count if progress else None)
            elif progress is not None:
                count(lay.size)
            files[file] = record
            for n, t in members.items():
                dtype = names.get(t.dtype) or names.setdefault(t.dtype, dtype_name(t.dtype))
                tensors[n] = TensorRecord(file, dtype, tuple(t.shape))
            reach(Point.SHARD_WRITTEN)
        reach(Point.TENSORS_WRITTEN)
        provenance = options.provenance_now()
        manifest = Manifest(
            step=step,
            created=provenance.created,
            library=provenance.library,
            origin=provenance.origin,
            metrics=prepared.metrics,
            files=files,
            tensors=tensors,
            aliases=prepared.aliases,
            state=prepared.skeleton,
            reused=reuser.reused,
        )
        manifest_bytes = manifest.to_bytes()
        txn.write(MANIFEST, manifest_bytes)
        reach(Point.MANIFEST_WRITTEN)
        txn.commit()
    except OSError as exc:  # out of space, I/O error, ...: nothing committed, nothing touched
        if txn is not None:
            txn.abort()
        if isinstance(exc, StatekeeperError) and type(exc) not in _WRAPPED:
            raise  # a statekeeper error of its own kind (a test's injected failure, ...)
        raise _save_failed(storage, step, total, exc) from exc
    except BaseException:
        if txn is not None:
            txn.abort()
        raise
    reach(Point.COMMITTED)
    reuser.committed(entry, files, {file: tuple(members) for file, members, _ in planned})
    return CheckpointInfo.from_manifest(storage.describe(entry), manifest, len(manifest_bytes))


def write_step(
    storage: Storage,
    captured: dict[str, Any],
    *,
    step: int,
    metrics: Mapping[str, Any] | None = None,
    options: SaveOptions | None = None,
    created: str | None = None,
    library: dict[str, str] | None = None,
) -> CheckpointInfo:
    """Write an already captured state as one committed step; the caller holds the writer lock.

    ``created`` / ``library`` pin the provenance fields (golden-file tests use them).
    """
    validate_step(step)
    options = options or SaveOptions()
    if created is not None or library is not None:
        now = Provenance.now()
        options = replace(
            options, provenance=Provenance(created or now.created, library or now.library)
        )
    with collector_paused():
        return commit(storage, prepare(captured, metrics), step=step, options=options)
