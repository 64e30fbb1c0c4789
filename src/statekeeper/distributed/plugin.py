"""What this package registers with the core: the job-wide save and load, and ``PerRank``."""

from __future__ import annotations

import torch.distributed as dist

from statekeeper.catalog.info import CheckpointInfo, RestoreInfo
from statekeeper.checkpoint.adapters import STATEFUL, Adapter, Kind, register
from statekeeper.checkpoint.async_save import AsyncWriter, PendingSave, Staging
from statekeeper.checkpoint.collective import State, register_collective
from statekeeper.checkpoint.options import RestoreOptions
from statekeeper.checkpoint.request import SaveRequest
from statekeeper.distributed.per_rank import PerRank
from statekeeper.errors import InvalidArgumentError
from statekeeper.storage.base import Storage

__all__ = ["Distributed", "install"]


class Distributed:
    """The :class:`~statekeeper.checkpoint.collective.Collective` of a torch.distributed job."""

    def save(self, storage: Storage, state: State, request: SaveRequest) -> CheckpointInfo:
        from statekeeper.distributed.save import save_distributed

        return save_distributed(storage, state, request)

    def load(
        self, storage: Storage, state: State, *, step: int | None, options: RestoreOptions
    ) -> RestoreInfo:
        from statekeeper.distributed.load import load_distributed

        return load_distributed(storage, state, step=step, options=options)

    def submit(
        self, storage: Storage, state: State, request: SaveRequest, writer: AsyncWriter
    ) -> PendingSave:
        from statekeeper.distributed.async_save import JobWriter

        if not isinstance(writer, JobWriter):
            raise InvalidArgumentError(
                "this background writer was made for single-process saves (the Checkpointer "
                "was created before torch.distributed was initialized): create the "
                "Checkpointer after init_process_group()"
            )
        return writer.submit_job(storage, state, request)

    def async_writer(self, staging: Staging) -> AsyncWriter:
        from statekeeper.distributed.async_save import JobWriter

        return JobWriter(staging)

    def decide(self, step: int, due: bool, signalled: bool, saved: bool) -> tuple[bool, bool, bool]:
        import torch

        from statekeeper.distributed.group import checkpoint_group

        group = checkpoint_group()
        first = dist.get_rank(group) == 0
        # one all_reduce(MAX) of five integers: no pickling, one round trip
        flags = torch.tensor(
            [int(due and first), int(signalled), int(saved and first), step, -step]
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        high, low = int(flags[3]), -int(flags[4])
        if high != low:
            raise InvalidArgumentError(
                f"maybe_save was called with different steps on the ranks of the job (from "
                f"{low} to {high}): call it with the same step on every rank"
            )
        return bool(flags[0]), bool(flags[1]), bool(flags[2])

    def is_leader(self) -> bool:
        return dist.get_rank() == 0


PER_RANK = Adapter(
    "per_rank",
    Kind.PER_RANK,
    lambda obj: isinstance(obj, PerRank),
    STATEFUL.capture,
    STATEFUL.restore,
)


def install() -> None:
    register(PER_RANK)
    register_collective(Distributed())
