"""The process group checkpoints talk over, and the few collectives they need.

Checkpoint collectives run on a dedicated gloo group created once per job (collectively,
the first time a distributed save or load runs), never on the training group: they move
small Python objects between CPUs and must not queue behind, or interleave with, NCCL
kernels of the training step. Objects exchanged here are plans and error messages passed
between the processes of one job; nothing read from a checkpoint is ever unpickled.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from statekeeper.errors import RankFailure

__all__ = ["CHECKPOINT_TIMEOUT", "agree", "broadcast", "checkpoint_group", "gather"]

CHECKPOINT_TIMEOUT = timedelta(minutes=30)
_groups: dict[int, dist.ProcessGroup] = {}


def checkpoint_group() -> dist.ProcessGroup:
    """The job's gloo group for checkpointing (created on first use, by every rank)."""
    default = dist.distributed_c10d._get_default_group()
    key = id(default)
    group = _groups.get(key)
    if group is None:
        group = dist.new_group(backend="gloo", timeout=CHECKPOINT_TIMEOUT)
        _groups.clear()  # a re-initialized job gets a new group; old ones are gone
        _groups[key] = group
    return group


def broadcast(value: Any, group: dist.ProcessGroup) -> Any:
    """Rank 0's ``value`` on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


def gather(value: Any, group: dist.ProcessGroup) -> list[Any]:
    """Every rank's ``value`` in rank order (on every rank)."""
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def _describe(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def agree(failure: BaseException | None, group: dist.ProcessGroup, what: str) -> None:
    """All ranks learn whether any failed at ``what``; each failing rank re-raises its own
    error, the others raise RankFailure naming the ranks that failed and why."""
    errors = gather(None if failure is None else _describe(failure), group)
    if failure is not None:
        raise failure
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        detail = "; ".join(f"rank {r}: {kind}: {msg}" for r, (kind, msg) in failed)
        raise RankFailure(f"{what} failed on another rank ({detail})", [k for _, (k, _) in failed])
