"""``torch.distributed.checkpoint`` storage adapters that keep statekeeper's format.

DCP plans a sharded save (which rank writes which chunk of which tensor; replicated tensors
once) and a resharded load (which chunks each rank needs for its current shards). These
adapters only move bytes: every rank writes its chunks as one standard safetensors file,
checksummed as it is streamed, into the step's in-progress entry; the plan DCP would pickle
into ``.metadata`` is instead handed back to the caller, which records it in the JSON
manifest. Loading rebuilds DCP's metadata from that manifest, so nothing is unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from statekeeper.checkpoint.writer import write_shard
from statekeeper.distributed.files import part
from statekeeper.errors import UnsupportedValueError
from statekeeper.format.dtypes import dtype_from_name, dtype_name
from statekeeper.format.sharding import Chunk, ShardedRecord
from statekeeper.storage.base import FileWriter

__all__ = ["ChunkWriter", "ManifestReader", "Written", "chunk_name", "sharded_records"]


def chunk_name(fqn: str, offsets: tuple[int, ...]) -> str:
    """The stored name of one chunk: ``"$chunk/model/w@0,128"`` (its global offsets). State
    names never start with ``$``, so chunk names cannot collide with tensor paths."""
    return f"$chunk/{fqn}@{','.join(map(str, offsets))}"


@dataclass(frozen=True)
class Written:
    """Where one chunk went, reported to the coordinator (never persisted as pickle)."""

    file: str
    tensor: str
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    file_size: int
    file_checksum: str


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class ChunkWriter(StorageWriter):
    """Each rank writes the chunks DCP assigns it into ``chunks-<rank>.safetensors``."""

    def __init__(self, files: FileWriter) -> None:
        super().__init__()
        self.files = files
        self.rank = 0
        self.metadata: Metadata | None = None
        self.results: list[list[WriteResult]] = []

    def reset(self, checkpoint_id: Any = None) -> None:
        return None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = int(kwargs.get("rank", 0))

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        file = f"chunks-{self.rank:05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        placed: list[tuple[Any, str, tuple[int, ...]]] = []
        for item in plan.items:
            if item.type is WriteItemType.BYTE_IO or item.tensor_data is None:
                raise UnsupportedValueError(item.index.fqn, "bytes", "non-tensor DCP items")
            offsets = tuple(int(o) for o in item.tensor_data.chunk.offsets)
            name = chunk_name(item.index.fqn, offsets)
            data = planner.resolve_data(item)
            if not isinstance(data, torch.Tensor):
                raise UnsupportedValueError(item.index.fqn, data, "non-tensor DCP items")
            tensors[name] = data.detach().to("cpu").contiguous()
            placed.append((item.index, name, offsets))
        if not tensors:
            return _done([])
        record = write_shard(self.files, file, tensors)
        results = [
            WriteResult(
                index=index,
                size_in_bytes=tensors[name].nbytes,
                storage_data=Written(
                    file,
                    name,
                    offsets,
                    tuple(tensors[name].shape),
                    dtype_name(tensors[name].dtype),
                    record.size,
                    record.checksum,
                ),
            )
            for index, name, offsets in placed
        ]
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        # The coordinator keeps the plan; the caller writes it into the JSON manifest.
        self.metadata = metadata
        self.results = results

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True

    def storage_meta(self) -> None:
        return None


def sharded_records(
    metadata: Metadata, results: list[list[WriteResult]]
) -> tuple[dict[str, ShardedRecord], list[Written]]:
    """``{fqn: ShardedRecord}`` from DCP's global plan, and where every chunk was written."""
    written = {r.index: r.storage_data for rs in results for r in rs}
    records: dict[str, ShardedRecord] = {}
    for fqn, meta in metadata.state_dict_metadata.items():
        if not isinstance(meta, TensorStorageMetadata):
            raise UnsupportedValueError(fqn, meta, "non-tensor DCP items")
        chunks = []
        for chunk in meta.chunks:
            offsets = tuple(int(o) for o in chunk.offsets)
            info = written[MetadataIndex(fqn, torch.Size(offsets))]
            chunks.append(Chunk(info.tensor, offsets))
        records[fqn] = ShardedRecord(
            dtype_name(meta.properties.dtype), tuple(int(d) for d in meta.size), tuple(chunks)
        )
    return records, list(written.values())


class ManifestReader(StorageReader):
    """Serves DCP's load plan from verified chunk tensors; metadata comes from the manifest.

    Targets are filled with the pieces of the chunks they need, except those in ``kept``
    (name -> the target's local tensor: a plain tensor, or a ``DTensor``'s shard): DCP plans
    against them (they may be the live tensors themselves), but nothing is written into
    them. What each should receive is kept in :attr:`read` instead: the stored chunk itself
    (a view, nothing copied) where one chunk holds the whole local tensor, otherwise a fresh
    buffer the pieces are copied into (chunks that tile the tensor fill all of it)."""

    def __init__(
        self,
        records: dict[str, ShardedRecord],
        chunk: Any,
        shape: Any,
        kept: dict[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.records = records
        self.chunk = chunk  # chunk(name) -> the verified stored chunk tensor (read on demand)
        self.shape = shape  # shape(name) -> its shape, from the manifest (nothing read)
        self.kept = kept or {}
        self.read: dict[str, torch.Tensor] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        return None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        entries: dict[str, Any] = {}
        storage: dict[MetadataIndex, str] = {}
        for fqn, rec in self.records.items():
            chunks = []
            for c in rec.chunks:
                sizes = torch.Size(self.shape(c.tensor))
                chunks.append(ChunkStorageMetadata(torch.Size(c.offsets), sizes))
                storage[MetadataIndex(fqn, torch.Size(c.offsets))] = c.tensor
            entries[fqn] = TensorStorageMetadata(
                TensorProperties(dtype=dtype_from_name(rec.dtype)), torch.Size(rec.shape), chunks
            )
        return Metadata(state_dict_metadata=entries, storage_data=storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, **kw: Any) -> None:
        self.storage_data: dict[MetadataIndex, str] = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for req in plan.items:
            piece = part(self.chunk(self.storage_data[req.storage_index]), req.storage_offsets,
                         req.lengths)  # fmt: skip
            name = req.dest_index.fqn
            whole = self.kept.get(name)
            if whole is None:
                target = planner.resolve_tensor(req).detach()
                target.copy_(piece)
                planner.commit_tensor(req, target)
            elif piece.shape == whole.shape:  # one chunk holds it all: that chunk stands for it
                self.read[name] = piece
            else:
                if name not in self.read:
                    self.read[name] = torch.empty_like(whole)
                part(self.read[name], req.dest_offsets, req.lengths).copy_(piece)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True
