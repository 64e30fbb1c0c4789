"""What this package registers with the core: the job-wide save and load, and ``PerRank``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from statekeeper.checkpoint.adapters import STATEFUL, Adapter, Kind, register
from statekeeper.checkpoint.collective import register_collective
from statekeeper.checkpoint.info import CheckpointInfo, RestoreInfo
from statekeeper.checkpoint.options import RestoreOptions, SaveOptions
from statekeeper.distributed.per_rank import PerRank
from statekeeper.storage.base import Storage

__all__ = ["Distributed", "install"]


class Distributed:
    """The :class:`~statekeeper.checkpoint.collective.Collective` of a torch.distributed job."""

    def save(
        self,
        storage: Storage,
        state: Mapping[str, Any],
        *,
        step: int,
        metrics: Mapping[str, Any] | None,
        options: SaveOptions,
    ) -> CheckpointInfo:
        from statekeeper.distributed.save import save_distributed

        return save_distributed(storage, state, step=step, metrics=metrics, options=options)

    def load(
        self,
        storage: Storage,
        state: Mapping[str, Any],
        *,
        step: int | None,
        options: RestoreOptions,
    ) -> RestoreInfo:
        from statekeeper.distributed.load import load_distributed

        return load_distributed(storage, state, step=step, options=options)

    def decide(self, due: bool, signalled: bool) -> tuple[bool, bool]:
        from statekeeper.distributed.group import checkpoint_group, gather

        every = gather((bool(due), bool(signalled)), checkpoint_group())
        return every[0][0], any(flag for _, flag in every)

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
