"""The save side of a :class:`~statekeeper.loop.checkpointer.Checkpointer`: the run's save
options, the time since the last save (what ``EverySeconds`` measures), the steps a restart
over damage saves again, and what follows each commit: retention (which never fails a
save), then the step queued for the mirror."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.checkpoint.async_save import AsyncWriter, PendingSave
from statekeeper.checkpoint.options import SaveOptions
from statekeeper.checkpoint.request import SaveRequest
from statekeeper.checkpoint.retention_policies import Retention
from statekeeper.checkpoint.save import save_state
from statekeeper.checkpoint.scope import Scope, is_distributed
from statekeeper.loop.damage import DamagedSteps
from statekeeper.loop.retention import Retainer, RetentionStatus
from statekeeper.loop.run_tiers import RunTiers
from statekeeper.storage.base import Storage

__all__ = ["LoopSaves"]

_clock: Callable[[], float] = time.monotonic
"""What ``EverySeconds`` is measured with (read at each use: the tests' seam for time)."""


class LoopSaves:
    """The saves of one Checkpointer (on every rank; ``leader``: the rank that writes the
    run directory, applies retention and tracks damaged steps)."""

    def __init__(
        self,
        storage: Storage,
        tiers: RunTiers,
        options: SaveOptions,
        *,
        scope: Scope,
        leader: bool,
        keep: Retention | None,
    ) -> None:
        self._storage = storage
        self._tiers = tiers
        self._options = options
        self._scope = scope
        self._distributed = is_distributed(scope)
        self._leader = leader
        self._retainer = Retainer(storage, keep)
        self._damaged = DamagedSteps(storage)  # skipped by a resume: saved again
        self._resumed_from: int | None = None
        self._last_save = _clock()

    def seconds_since_last(self) -> float:
        return _clock() - self._last_save

    def saved_before(self, step: int) -> bool:
        """Whether ``step`` is committed already in this run (not due again)."""
        return self._damaged.saved(step)

    def restored(self, step: int | None, *, resumed: bool) -> None:
        """A restore loaded ``step`` (None: nothing); ``resumed``: by ``restore_latest``,
        which also learns which newer steps it skipped as damaged."""
        if resumed and self._leader:
            self._damaged.found(step)
        if step is not None:
            self._resumed_from = step
            self._last_save = _clock()

    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        metrics: Mapping[str, Any] | None,
        writer: AsyncWriter | None,
        *,
        overwrite: bool,
        wait_writer: Callable[[], None],
    ) -> CheckpointInfo | PendingSave:
        """One save of the full ``state`` (RNG included), through ``writer`` when given."""
        self._tiers.before_save()
        if is_distributed(self._scope, state) and not self._distributed:
            writer = None  # made before the process group: its writer is a local one
        if self._leader and step in self._damaged:  # a restart over damage: kept aside
            wait_writer()
            overwrite = self._damaged.set_aside(step) or overwrite
        options = replace(self._options, overwrite=True) if overwrite else self._options
        on_commit = self._retention if writer is not None else self._committed
        result = save_state(
            self._storage,
            state,
            SaveRequest(step, metrics, options, on_commit),
            scope=self._scope,
            writer=writer,
        )
        if writer is not None:  # a blocking save set the clock when it committed
            self._last_save = _clock()
        return result

    def _committed(self, info: CheckpointInfo) -> None:
        self._last_save = _clock()  # the step is saved, whatever retention does next
        self._retention(info)

    def _retention(self, info: CheckpointInfo) -> None:
        if self._leader:  # in a job, rank 0 applies retention for everyone; never fails
            self._retainer.apply(info.step, self._protected())  # a committed save: it warns
        self._tiers.committed(info.step, self._scope)  # last: the upload starts now

    def _protected(self) -> set[int]:
        """Steps retention keeps besides the new one: the step resumed from, and those
        waiting for their upload."""
        resumed = set() if self._resumed_from is None else {self._resumed_from}
        return resumed | self._tiers.pending()

    def retention_status(self) -> RetentionStatus:
        return self._retainer.status()
