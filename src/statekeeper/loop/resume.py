"""Resuming from the newest intact step of one or more tiers."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from statekeeper.catalog.info import RestoreInfo
from statekeeper.catalog.location import committed
from statekeeper.checkpoint.load import Strict, load
from statekeeper.checkpoint.scope import Scope
from statekeeper.errors import (
    CheckpointUnreadableError,
    RankFailure,
    StatekeeperError,
    StatekeeperWarning,
    StepNotFoundError,
    StorageError,
    raised_only,
    user_stacklevel,
)
from statekeeper.state.optimizer import OptimizerChange
from statekeeper.storage.base import Storage

__all__ = ["newest_intact"]


def _candidates(tiers: Sequence[Storage]) -> list[tuple[int, Storage]]:
    """Every committed step of every tier, newest first; for one step, the tiers in order
    (the local one first: no download). A tier that cannot be listed now (an unreachable
    store) offers nothing, with a warning."""
    found: list[tuple[int, int, Storage]] = []
    for rank, tier in enumerate(tiers):
        try:
            steps = [p.step for p in committed(tier)]
        except StorageError as exc:
            warnings.warn(
                f"statekeeper: cannot list {tier.describe()} ({exc}); resuming from the others",
                StatekeeperWarning,
                stacklevel=user_stacklevel(),
            )
            continue
        found.extend((step, rank, tier) for step in steps)
    found.sort(key=lambda c: (-c[0], c[1]))
    return [(step, tier) for step, _, tier in found]


def newest_intact(
    tiers: Sequence[Storage],
    state: Mapping[str, Any],
    *,
    strict: Strict,
    scope: Scope,
    on_optimizer_change: OptimizerChange,
) -> RestoreInfo | None:
    """Load into ``state`` the newest step that loads intact from any of ``tiers`` (every
    byte verified before a live tensor changes); a damaged or vanished step is skipped with
    a warning, and the same step is then tried on the next tier."""
    for step, tier in _candidates(tiers):
        try:
            return load(
                tier,
                state,
                step=step,
                strict=strict,
                scope=scope,
                on_optimizer_change=on_optimizer_change,
            )
        except (CheckpointUnreadableError, StepNotFoundError, StorageError, RankFailure) as exc:
            # unreadable, deleted while read, or (a mirror) unreachable: skipped, on every
            # rank alike; the first tier's storage errors are the user's to see
            skippable: tuple[type[StatekeeperError], ...] = (
                CheckpointUnreadableError,
                StepNotFoundError,
            )
            if tier is not tiers[0]:
                skippable += (StorageError,)
            if not raised_only(exc, *skippable):
                raise
            what = "deleted" if raised_only(exc, StepNotFoundError) else "damaged"
            if raised_only(exc, StorageError):
                what = "unreachable"
            warnings.warn(
                f"statekeeper: skipping {what} step {step} of {tier.describe()}: {exc}",
                StatekeeperWarning,
                stacklevel=user_stacklevel(),
            )
    return None
