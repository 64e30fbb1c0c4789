"""What one rank of a job's load checks and plans before a live tensor changes: the step's
files and records, the targets its current shards need, and where each target lies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from statekeeper.catalog.location import Location
from statekeeper.checkpoint.checks import Strict
from statekeeper.checkpoint.direct import copy_pairs
from statekeeper.checkpoint.origin import warn_if_other_torch
from statekeeper.checkpoint.reader import read_manifest
from statekeeper.distributed.files import VerifiedFiles, buffer_like, local_box, local_memory
from statekeeper.distributed.state import Split, capture_distributed, optimizer_problems
from statekeeper.errors import KeyMismatchError
from statekeeper.format.dtypes import dtype_from_name
from statekeeper.format.sharding import Box, ShardedRecord
from statekeeper.state.tree import flatten

__all__ = ["SKIP", "ReadPlan"]

SKIP = object()  # a checkpoint tensor of a module or optimizer that the live one lacks


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


class ReadPlan:
    """What one rank checked before anything is read: the step, its files and targets."""

    def __init__(self, location: Location, parts: Split, strict: Strict, rank: int, world: int):
        self.location = location
        self.manifest = read_manifest(location)
        warn_if_other_torch(self.manifest.library, location.path())
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
        self.sharded = set(parts.modules) | set(parts.optimizers)
        # what the read is planned for: the live tensors of modules and optimizers (written
        # only by fill(), once every rank has read; self.kept: their local memory), fresh
        # buffers for the rest
        self.targets: dict[str, torch.Tensor] = {}
        self.kept: dict[str, torch.Tensor] = {}
        self.boxes: dict[str, Box | None] = {}  # where each target's local part lies
        for n, t in live.items():
            if n not in self.records:
                continue
            local = local_memory(t) if n.split("/", 1)[0] in self.sharded else None
            if local is None:
                self.targets[n] = buffer_like(t)
            else:
                self.targets[n], self.kept[n] = t, local
            self.boxes[n] = local_box(t)
        self.files.check_tiling({n: self.records[n] for n in self.targets})
        self.read: dict[str, torch.Tensor] = {}  # kept name -> what it receives
        self.local = all(box is not None for box in self.boxes.values())
        self.decoded: tuple[dict[str, Any], dict[str, Any] | None] = ({}, None)
        self.files.verify_share(rank, world)

    def lookup(self, name: str) -> Any:
        if name in self.targets:
            return self.targets[name]
        if name.split("/", 1)[0] in self.sharded:
            return SKIP  # never a full tensor where the live object holds a shard
        return self.files.tensor(name)

    def read_local(self) -> None:
        """Read every target's part, planned here from the manifest (:attr:`local` says
        that every target is of a kind this can plan)."""
        for name, box in self.boxes.items():
            assert box is not None  # read_local() is called only when every box is known
            record = self.records[name]
            if name in self.kept:
                self.read[name] = self.files.read_part(record, box)
            else:
                target = local_memory(self.targets[name])
                self.files.read_part(record, box, target)

    def unread(self) -> list[str]:
        """Kept tensors the read gave nothing for (only chunks that do not tile them)."""
        return [n for n, t in self.kept.items() if t.numel() and n not in self.read]

    def fill(self) -> None:
        """Copy what was read into the live tensors of modules and optimizers."""
        copy_pairs([(t, self.read[n]) for n, t in self.kept.items() if n in self.read])
