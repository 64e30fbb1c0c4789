"""A load by every rank of a job, into whatever sharding the live objects have now.

Rank 0 picks the step (the newest committed one unless asked) and tells the others. Every
rank then checks the names, shapes and dtypes of its live state against the manifest (and
that each tensor's chunks tile it), verifies its share of the step's files against their
checksums, and reads the chunks its current shards need: planned locally from the JSON
manifest (no plans exchanged), or through ``torch.distributed.checkpoint.load`` where a
target is of a kind only DCP's planner handles (all ranks take the same way). The read
writes no live tensor: a shard of a module or optimizer that one stored chunk holds whole
is kept as a view of that chunk, others are assembled in fresh buffers. Only when every
rank got this far are the live objects loaded (one copy from the verified files into each
live tensor): a damaged file or a mismatch on any rank leaves every rank's state untouched.

Per-rank state (RNG, data loaders, ``PerRank`` entries) of rank ``r`` is restored on rank
``r`` when the saving job had that rank. When the world size changed, ranks the saving job
did not have keep their current per-rank state, and every rank warns which entries were not
restored: reseed and rebuild data loaders for the new world size.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from statekeeper.catalog.info import RestoreInfo
from statekeeper.catalog.location import Location, locate
from statekeeper.checkpoint.adapters import Restoring
from statekeeper.checkpoint.checks import Strict
from statekeeper.checkpoint.load import restore_entry, restore_order
from statekeeper.checkpoint.options import RestoreOptions
from statekeeper.distributed.dcp_storage import ManifestReader
from statekeeper.distributed.group import agree, checkpoint_group, from_rank0, gather
from statekeeper.distributed.read_plan import SKIP, ReadPlan
from statekeeper.distributed.state import (
    Split,
    apply_module,
    apply_optimizer,
    split,
)
from statekeeper.errors import (
    RankFailure,
    StatekeeperError,
    StatekeeperWarning,
    user_stacklevel,
)
from statekeeper.format.malformed import FormatError, corrupt
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.state.tree import unflatten
from statekeeper.storage.base import Storage

__all__ = ["load_distributed"]


def _choose(storage: Storage, step: int | None, group: dist.ProcessGroup) -> Location:
    picked: tuple[str, int] | None = None
    failure: BaseException | None = None
    if dist.get_rank(group) == 0:
        try:
            loc = locate(storage, step)
            picked = (loc.entry, loc.step)
        except BaseException as exc:
            failure = exc
    entry, found = from_rank0(picked, failure, group, "finding the step to load")
    return Location(storage, entry, found)


def _prune(value: Any) -> Any:
    """``value`` without the entries whose tensor the live objects do not have (and without
    the dicts that held nothing else)."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if item is SKIP:
            continue
        pruned = _prune(item)
        if isinstance(item, dict) and item and not pruned:
            continue
        out[key] = pruned
    return out


def _saved_per_rank(manifest: Manifest, rank: int, lookup: Any) -> dict[str, Any] | None:
    if manifest.sharding is None:
        return None
    ranks = manifest.sharding.ranks
    if rank >= len(ranks):
        return {}
    mine = unflatten(ranks[rank], lookup)
    if not isinstance(mine, dict):
        raise FormatError("per-rank state is not a mapping")
    return mine


def load_distributed(
    storage: Storage, state: Mapping[str, Any], *, step: int | None, options: RestoreOptions
) -> RestoreInfo:
    """Load a committed step into ``state`` on every rank (call it on all ranks)."""
    strict = options.strict
    group = checkpoint_group()
    rank = dist.get_rank(group)
    parts = split(state)
    fresh = [opt for opt, _ in parts.optimizers.values() if not opt.state]
    location = _choose(storage, step, group)
    try:
        plan = _checked(location, parts, strict, rank, group)
        saved, mine = _read(plan, rank, group)
    except BaseException:
        for optimizer in fresh:  # undo the state created to read into
            optimizer.state.clear()
        raise
    plan.fill()  # every rank has read and decoded its share: from here live tensors change
    ctx = Restoring(state, strict, options.on_optimizer_change)
    return _apply_all(plan, parts, saved, mine, rank, ctx)


def _checked(
    location: Location, parts: Split, strict: Strict, rank: int, group: dist.ProcessGroup
) -> ReadPlan:
    failure: BaseException | None = None
    plan: ReadPlan | None = None
    try:
        plan = ReadPlan(location, parts, strict, rank, dist.get_world_size(group))
    except BaseException as exc:
        failure = exc
    agree(failure, group, f"checking step {location.step}")
    assert plan is not None  # agree() raised otherwise
    plan.files.mark_checked()  # every file was verified by one rank, and all agreed
    plan.local = all(gather(plan.local, group))  # DCP's load is collective: all or none
    return plan


def _read(
    plan: ReadPlan, rank: int, group: dist.ProcessGroup
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    failure: BaseException | None = None
    try:
        if plan.local:
            plan.read_local()
        else:
            _read_dcp(plan, group)
    except StatekeeperError as exc:
        failure = exc
    except (RuntimeError, CheckpointException) as exc:
        failure = RankFailure(
            f"reading step {plan.location.step} failed ({exc}); nothing was loaded"
        )
        failure.__cause__ = exc
    except BaseException as exc:
        failure = exc
    if failure is None:
        failure = _decode(plan, rank)
    agree(failure, group, f"reading step {plan.location.step}")
    return plan.decoded


def _decode(plan: ReadPlan, rank: int) -> BaseException | None:
    """Decode the state (into ``plan.decoded``); the error, if that failed."""
    try:
        unread = plan.unread()
        if unread:
            raise FormatError(f"the stored chunks do not cover {', '.join(unread[:5])}")
        decoded = unflatten(plan.manifest.state, plan.lookup)
        if not isinstance(decoded, dict):
            raise FormatError("state is not a mapping")
        plan.decoded = (_prune(decoded), _saved_per_rank(plan.manifest, rank, plan.lookup))
    except FormatError as exc:  # only a crafted manifest; a bug in the code is not damage
        error = corrupt(plan.location.path(MANIFEST), exc, "state is malformed: {}")
        error.__cause__ = exc  # returned to be agreed on by every rank, then raised
        return error
    except BaseException as exc:
        return exc
    return None


def _read_dcp(plan: ReadPlan, group: dist.ProcessGroup) -> None:
    """Read through ``torch.distributed.checkpoint.load`` (collective: its errors reach every
    rank), for targets :meth:`ReadPlan.read_local` cannot plan."""
    reader = ManifestReader(plan.records, plan.files.tensor, plan.files.shape, plan.kept)
    plan.read = reader.read
    dcp_load(plan.targets, storage_reader=reader, process_group=group)


def _apply_all(
    plan: ReadPlan,
    parts: Split,
    saved: dict[str, Any],
    mine: dict[str, Any] | None,
    rank: int,
    ctx: Restoring,
) -> RestoreInfo:
    manifest = plan.manifest
    strict = ctx.strict
    if mine is None:  # saved by one process: its per-rank entries are rank 0's
        mine = {n: saved.pop(n) for n in list(saved) if n in parts.per_rank} if rank == 0 else {}
    for name, module in parts.modules.items():
        if name in saved:
            apply_module(module, saved[name], strict)
    for name, (optimizer, owner) in parts.optimizers.items():
        if name in saved:
            apply_optimizer(optimizer, parts.modules[owner], owner, saved[name], strict)
    for name, obj in parts.replicated.items():
        if name in saved:
            restore_entry(name, obj, saved[name], ctx)
    order = restore_order(parts.per_rank)  # RNG last
    for name in order:
        if name in mine:
            restore_entry(name, parts.per_rank[name], mine[name], ctx)
    skipped = [n for n in order if n not in mine]
    if skipped:
        saved_world = len(manifest.sharding.ranks) if manifest.sharding is not None else 1
        warnings.warn(
            f"statekeeper: rank {rank} kept its current {', '.join(skipped)}: step "
            f"{manifest.step} was saved by {saved_world} process(es) and holds no per-rank state "
            f"for rank {rank}. Reseed and rebuild data loaders for the new world size.",
            StatekeeperWarning,
            stacklevel=user_stacklevel(),
        )
    return RestoreInfo(manifest.step, plan.location.path(), ctx.values, ())
