"""A load by every rank of a job, into whatever sharding the live objects have now.

Rank 0 picks the step (the newest committed one unless asked) and tells the others. Every
rank then checks the names, shapes and dtypes of its live state against the manifest,
reads the chunks its current shards need through ``torch.distributed.checkpoint.load``
(planned from the JSON manifest; each file verified against its checksum before use) into
fresh buffers, and only when every rank got this far are the live objects loaded: a
damaged file or a mismatch on any rank leaves every rank's state untouched.

Per-rank state (RNG, data loaders, ``PerRank`` entries) of rank ``r`` is restored on rank
``r`` when the saving job had that rank. When the world size changed, ranks the saving job
did not have keep their current per-rank state, and every rank warns which entries were not
restored: reseed and rebuild data loaders for the new world size.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from statekeeper.checkpoint.adapters import Restoring
from statekeeper.checkpoint.checks import Strict
from statekeeper.checkpoint.info import RestoreInfo
from statekeeper.checkpoint.load import restore_entry, restore_order
from statekeeper.checkpoint.location import Location, locate
from statekeeper.checkpoint.options import RestoreOptions
from statekeeper.checkpoint.reader import read_manifest
from statekeeper.distributed.dcp_storage import ManifestReader
from statekeeper.distributed.files import VerifiedFiles
from statekeeper.distributed.group import agree, checkpoint_group, from_rank0
from statekeeper.distributed.state import (
    Split,
    apply_module,
    apply_optimizer,
    capture_distributed,
    optimizer_problems,
    split,
)
from statekeeper.errors import (
    CorruptCheckpointError,
    KeyMismatchError,
    RankFailure,
    StatekeeperError,
    StatekeeperWarning,
    user_stacklevel,
)
from statekeeper.format.dtypes import dtype_from_name
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.sharding import ShardedRecord
from statekeeper.state.tree import flatten, unflatten
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


_SKIP = object()  # a checkpoint tensor of a module or optimizer that the live one lacks


def _problems(
    live: dict[str, torch.Tensor],
    records: Mapping[str, ShardedRecord],
    saved_entries: set[str],
    parts: Split,
    strict: Strict,
) -> list[str]:
    problems: list[str] = []
    sharded = set(parts.modules) | set(parts.optimizers)
    for name, t in live.items():
        rec = records.get(name)
        if rec is None:
            if name.split("/", 1)[0] in saved_entries and not strict.missing_ok:
                problems.append(f"{name}: missing from the checkpoint")
        elif tuple(t.shape) != rec.shape:
            problems.append(f"{name}: shape {rec.shape} in checkpoint, {tuple(t.shape)} live")
        elif dtype_from_name(rec.dtype) != t.dtype:
            problems.append(f"{name}: dtype {rec.dtype} in checkpoint, {t.dtype} live")
    if not strict.unexpected_ok:
        problems += [
            f"{n}: in the checkpoint but not in the live state"
            for n in records
            if n.split("/", 1)[0] in sharded and n not in live
        ]
    return problems


def _prune(value: Any) -> Any:
    """``value`` without the entries whose tensor the live objects do not have (and without
    the dicts that held nothing else)."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if item is _SKIP:
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
        raise ValueError("per-rank state is not a mapping")
    return mine


class _Plan:
    """What one rank checked before anything is read: the step, its files and targets."""

    def __init__(self, location: Location, parts: Split, strict: Strict, rank: int, world: int):
        self.location = location
        self.manifest = read_manifest(location)
        self.files = VerifiedFiles(location, self.manifest)
        self.records = self.files.records()
        raw = self.manifest.state if isinstance(self.manifest.state, dict) else {}
        live = flatten(capture_distributed(parts, initialize=True)).tensors
        for name in parts.optimizers:  # saved before its first step: the live state goes
            if isinstance(raw.get(name), dict) and raw[name].get("state") == {}:
                live = {n: t for n, t in live.items() if not n.startswith(f"{name}/state/")}
        wanted = [*parts.modules, *parts.optimizers, *parts.replicated]
        problems = (
            []
            if strict.missing_ok
            else [f"{n}: missing from the checkpoint" for n in wanted if n not in raw]
        )
        problems += _problems(live, self.records, set(raw), parts, strict)
        for name, (_, owner) in parts.optimizers.items():
            if name in raw:
                problems += optimizer_problems(name, owner, raw[name])
        if problems:
            raise KeyMismatchError(problems)
        self.targets = {n: t.detach().clone() for n, t in live.items() if n in self.records}
        self.sharded = set(parts.modules) | set(parts.optimizers)
        self.files.verify_share(rank, world)

    def lookup(self, name: str) -> Any:
        if name in self.targets:
            return self.targets[name]
        if name.split("/", 1)[0] in self.sharded:
            return _SKIP  # never a full tensor where the live object holds a shard
        return self.files.tensor(name)


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
    return _apply_all(plan, parts, saved, mine, rank, Restoring(state, strict, options.change))


def _checked(
    location: Location, parts: Split, strict: Strict, rank: int, group: dist.ProcessGroup
) -> _Plan:
    failure: BaseException | None = None
    plan: _Plan | None = None
    try:
        plan = _Plan(location, parts, strict, rank, dist.get_world_size(group))
    except BaseException as exc:
        failure = exc
    agree(failure, group, f"checking step {location.step}")
    assert plan is not None  # agree() raised otherwise
    plan.files.mark_checked()  # every file was verified by one rank, and all agreed
    return plan


def _read(
    plan: _Plan, rank: int, group: dist.ProcessGroup
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    reader = ManifestReader(plan.records, plan.files.tensor, plan.files.shape)
    try:
        dcp_load(plan.targets, storage_reader=reader, process_group=group)
    except (RuntimeError, CheckpointException) as exc:
        if isinstance(exc, StatekeeperError):
            raise
        raise RankFailure(
            f"reading step {plan.location.step} failed ({exc}); nothing was loaded"
        ) from exc
    failure: BaseException | None = None
    saved: dict[str, Any] = {}
    mine: dict[str, Any] | None = None
    try:
        decoded = unflatten(plan.manifest.state, plan.lookup)
        if not isinstance(decoded, dict):
            raise ValueError("state is not a mapping")
        saved = _prune(decoded)
        mine = _saved_per_rank(plan.manifest, rank, plan.lookup)
    except (ValueError, TypeError, RuntimeError) as exc:
        path = plan.location.path(MANIFEST)
        failure = CorruptCheckpointError(path, f"state is malformed: {exc}")
    except BaseException as exc:
        failure = exc
    agree(failure, group, f"reading step {plan.location.step}")
    return saved, mine


def _apply_all(
    plan: _Plan,
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
