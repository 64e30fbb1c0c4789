"""A save by every rank of a job: sharded through DCP, committed once by rank 0.

1. rank 0 takes the run directory's writer lock, checks the step and begins the entry;
   the others learn its in-progress name (or rank 0's error) by broadcast;
2. every rank captures its per-rank state (RNG first) and writes it to
   ``rank-<r>.safetensors``; then all agree that this worked everywhere;
3. ``torch.distributed.checkpoint.save`` plans the sharded and replicated tensors (each
   chunk written once, replicated tensors by one rank) and every rank streams its chunks
   into ``chunks-<r>.safetensors``, checksummed and fsynced; DCP gathers the results;
4. rank 0 writes the manifest (version 2) and commits; every rank learns the outcome.

Any failure, on any rank, aborts the entry: no step is committed. A rank that dies makes
the others' collectives fail (or time out after ``CHECKPOINT_TIMEOUT``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.catalog.naming import step_entry
from statekeeper.catalog.paths import writer_lock
from statekeeper.checkpoint.options import SaveOptions
from statekeeper.checkpoint.request import SaveRequest
from statekeeper.checkpoint.save import capture
from statekeeper.checkpoint.writer import check_step, encode_metrics, write_shard
from statekeeper.distributed.dcp_storage import ChunkWriter, sharded_records
from statekeeper.distributed.group import agree, checkpoint_group, from_rank0, gather
from statekeeper.distributed.state import Split, capture_distributed, split
from statekeeper.errors import InvalidArgumentError, RankFailure, StatekeeperError
from statekeeper.format.dtypes import dtype_name
from statekeeper.format.manifest import MANIFEST, FileRecord, Manifest, TensorRecord
from statekeeper.format.sharding import ShardedRecord, Sharding
from statekeeper.format.values import Json
from statekeeper.state.tree import Flat, flatten
from statekeeper.storage.base import FileWriter, SharedStorage, Storage, Transaction

__all__ = [
    "Begun",
    "Captured",
    "capture_step",
    "captured_alike",
    "require_shared",
    "save_distributed",
    "write_captured",
]


@dataclass(frozen=True)
class _RankPart:
    """What one rank wrote of its own state, sent to rank 0 for the manifest."""

    skeleton: Json
    file: str | None
    record: FileRecord | None
    tensors: dict[str, TensorRecord]


def _write_rank(files: FileWriter, rank: int, flat: Flat) -> _RankPart:
    """Write this rank's own (flattened) state into its file; what rank 0 records of it."""
    if not flat.tensors:
        return _RankPart(flat.skeleton, None, None, {})
    file = f"rank-{rank:05d}.safetensors"
    tensors = {n: t.to("cpu").contiguous() for n, t in flat.tensors.items()}
    record = write_shard(files, file, tensors)
    records = {
        n: TensorRecord(file, dtype_name(t.dtype), tuple(t.shape)) for n, t in tensors.items()
    }
    return _RankPart(flat.skeleton, file, record, records)


@dataclass(frozen=True)
class Captured:
    """One rank's state for a step, flattened: its own entries (RNG, loaders, ``PerRank``)
    and the job's (modules and optimizers as DCP state dicts, replicated entries)."""

    per_rank: Flat
    shared: Flat


def capture_step(parts: Split, rank: int) -> Captured:
    """This rank's state for a step: its own entries first (the RNG before any other
    ``state_dict()``), then the job's."""
    per_rank = flatten(capture(parts.per_rank), root=f"$rank/{rank}")  # "$": no path clash
    return Captured(per_rank, flatten(capture_distributed(parts)))


def _manifest(
    request: SaveRequest, skeleton: Json, writer: ChunkWriter, parts: list[_RankPart]
) -> Manifest:
    files: dict[str, FileRecord] = {}
    tensors: dict[str, TensorRecord] = {}
    records: dict[str, ShardedRecord] = {}
    if writer.metadata is not None:
        records, written = sharded_records(writer.metadata, writer.results)
        for w in written:
            files[w.file] = FileRecord(w.file_size, w.file_checksum)
            tensors[w.tensor] = TensorRecord(w.file, w.dtype, w.shape)
    for part in parts:
        if part.file is not None and part.record is not None:
            files[part.file] = part.record
            tensors.update(part.tensors)
    provenance = request.options.provenance_now()
    return Manifest(
        step=request.step,
        created=provenance.created,
        library=provenance.library,
        origin=provenance.origin,
        metrics=encode_metrics(request.metrics),
        files=files,
        tensors=tensors,
        aliases={},
        state=skeleton,
        sharding=Sharding(records, [p.skeleton for p in parts]),
    )


def _planner() -> DefaultSavePlanner:
    """DCP's planner, with every replicated tensor written by rank 0: replicated entries are
    rank 0's values, like their non-tensor parts (torch < 2.5 balances them over ranks)."""
    try:
        return DefaultSavePlanner(dedup_save_to_lowest_rank=True)
    except TypeError:
        return DefaultSavePlanner()


def _begin(storage: Storage, step: int, overwrite: bool) -> Transaction:
    exists = check_step(storage, step, overwrite)
    return storage.begin(step_entry(step), replace=exists)


def require_shared(storage: Storage) -> SharedStorage:
    """``storage``, which several processes must be able to write."""
    if not isinstance(storage, SharedStorage):
        raise InvalidArgumentError(
            f"{storage.describe()}: a distributed save needs a storage that several "
            "processes can write (LocalStorage on a shared file system, or an fsspec URL)"
        )
    return storage


class Begun:
    """A step begun by every rank over ``group``: rank 0 holds the run's lock and the
    transaction, every rank knows the entry's in-progress name."""

    def __init__(
        self, storage: Storage, step: int, options: SaveOptions, group: dist.ProcessGroup
    ) -> None:
        self.storage: SharedStorage = require_shared(storage)
        self.group = group
        self.rank = dist.get_rank(self.group)
        self.txn: Transaction | None = None
        self._lock = writer_lock(storage) if self.rank == 0 else None
        begun: BaseException | None = None
        try:
            if self._lock is not None:
                self._lock.__enter__()
                self.txn = _begin(storage, step, options.overwrite)
        except BaseException as exc:
            begun = exc
        try:
            entry = self.txn.entry if self.txn else None
            self.entry: str = from_rank0(entry, begun, self.group, f"beginning step {step}")
        except BaseException:
            self.end(failed=True)
            raise

    def end(self, *, failed: bool) -> None:
        """Abort the transaction (when ``failed``) and release the lock (rank 0)."""
        if failed and self.txn is not None:
            self.txn.abort()
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.__exit__(None, None, None)


def save_distributed(
    storage: Storage, state: Mapping[str, Any], request: SaveRequest
) -> CheckpointInfo:
    """Save ``state`` as ``request`` says with every rank of the job (call it on all ranks)."""
    parts = split(state)
    begun = Begun(storage, request.step, request.options, checkpoint_group())
    failed = True
    try:
        capture_now = lambda: capture_step(parts, begun.rank)  # noqa: E731
        captured = captured_alike(begun, capture_now, request.step)
        info = write_captured(begun, begun.group, captured, request)
        failed = False
        return info
    finally:
        begun.end(failed=failed)


def captured_alike(begun: Begun, capture_now: Any, step: int) -> Captured:
    """``capture_now()`` on every rank; all ranks learn whether any failed."""
    failure: BaseException | None = None
    captured: Captured | None = None
    try:
        captured = capture_now()
    except BaseException as exc:
        failure = exc
    agree(failure, begun.group, f"capturing the state of step {step}")
    assert captured is not None  # or agree() raised
    return captured


def write_captured(
    begun: Begun, group: dist.ProcessGroup, captured: Captured, request: SaveRequest
) -> CheckpointInfo:
    """Write a captured step with every rank, over ``group``, then commit (rank 0)."""
    storage, txn, rank, step = begun.storage, begun.txn, begun.rank, request.step
    failure: BaseException | None = None
    mine: _RankPart | None = None
    files: FileWriter | None = txn
    try:
        if files is None:
            files = storage.attach(begun.entry)
        mine = _write_rank(files, rank, captured.per_rank)
    except BaseException as exc:
        failure = exc
    agree(failure, group, f"writing the per-rank state of step {step}")
    assert mine is not None and files is not None  # or agree() raised
    flat = captured.shared
    writer = ChunkWriter(files)
    try:
        dcp_save(dict(flat.tensors), storage_writer=writer, planner=_planner(), process_group=group)
        everyone: list[_RankPart] = gather(mine, group)
    except (RuntimeError, CheckpointException) as exc:
        if isinstance(exc, StatekeeperError):
            raise
        raise RankFailure(
            f"step {step} was not committed: writing the shards failed ({exc}). If another "
            "rank died or hung, its log says why; the previous step is intact."
        ) from exc
    info: CheckpointInfo | None = None
    failure = None
    if txn is not None:
        try:
            manifest = _manifest(request, flat.skeleton, writer, everyone)
            data = manifest.to_bytes()
            txn.write(MANIFEST, data)
            txn.commit()
            info = CheckpointInfo.from_manifest(
                storage.describe(step_entry(step)), manifest, len(data)
            )
        except BaseException as exc:
            failure = exc
    outcome: CheckpointInfo = from_rank0(info, failure, group, f"committing step {step}")
    return outcome
