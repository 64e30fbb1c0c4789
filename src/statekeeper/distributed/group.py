"""The process group checkpoints talk over, and the few collectives they need.

Checkpoint collectives run on a dedicated gloo group created once per job (collectively,
the first time a distributed save or load runs), never on the training group: they move
small Python objects between CPUs and must not queue behind, or interleave with, NCCL
kernels of the training step. Objects exchanged here are plans and error messages passed
between the processes of one job; nothing read from a checkpoint is ever unpickled.
"""

from __future__ import annotations

import atexit
from contextlib import suppress
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from statekeeper.errors import RankFailure

__all__ = [
    "CHECKPOINT_TIMEOUT",
    "agree",
    "background_group",
    "broadcast",
    "checkpoint_group",
    "from_rank0",
    "gather",
]

CHECKPOINT_TIMEOUT = timedelta(minutes=30)
_groups: dict[int, dist.ProcessGroup] = {}
# Drop this module's reference while the interpreter is still whole: otherwise, after the
# user's destroy_process_group(), the group's C++ object (and gloo's threads) would be torn
# down during interpreter finalization, where gloo can abort the process ("terminate called
# without an active exception"; seen in full test runs, with statekeeper.testing's ranks,
# which also skipped destroy_process_group until then).
atexit.register(_groups.clear)


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


_background: dict[int, dist.ProcessGroup] = {}
atexit.register(_background.clear)


def background_group() -> dist.ProcessGroup:
    """The job's second gloo group, for background saves (created on first use, by every
    rank, from the main thread): a background save's collectives never share a group with
    the ones the training loop's thread runs meanwhile (``maybe_save``'s decision, loads)."""
    checkpoint_group()  # the same creation order on every rank
    default = dist.distributed_c10d._get_default_group()
    key = id(default)
    group = _background.get(key)
    if group is None:
        group = dist.new_group(backend="gloo", timeout=CHECKPOINT_TIMEOUT)
        _background.clear()
        _background[key] = group
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


def _mark(exc: BaseException, kinds: list[str]) -> BaseException:
    """Record on ``exc`` the error kinds of every rank (see ``errors.error_kinds``)."""
    with suppress(AttributeError):  # an exception type with __slots__: error_kinds falls back
        exc.rank_kinds = tuple(kinds)  # type: ignore[attr-defined]
    return exc


def agree(failure: BaseException | None, group: dist.ProcessGroup, what: str) -> None:
    """All ranks learn whether any failed at ``what``; each failing rank re-raises its own
    error, the others raise RankFailure naming the ranks that failed and why. Every rank's
    error carries the kinds of all failures (:func:`statekeeper.errors.error_kinds`)."""
    errors = gather(None if failure is None else _describe(failure), group)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    kinds = [kind for _, (kind, _) in failed]
    if failure is not None:
        raise _mark(failure, kinds)
    if failed:
        detail = "; ".join(f"rank {r}: {kind}: {msg}" for r, (kind, msg) in failed)
        raise RankFailure(f"{what} failed on another rank ({detail})", kinds)


def from_rank0(
    value: Any, failure: BaseException | None, group: dist.ProcessGroup, what: str
) -> Any:
    """Rank 0's ``value`` on every rank, or, when rank 0 failed, its error: rank 0 re-raises
    its own, the others raise RankFailure naming it."""
    sent = broadcast(("ok", value) if failure is None else ("error", *_describe(failure)), group)
    if failure is not None:
        raise _mark(failure, [sent[1]])
    if sent[0] == "error":
        raise RankFailure(f"{what} failed on rank 0 ({sent[1]}: {sent[2]})", [sent[1]])
    return sent[1]
