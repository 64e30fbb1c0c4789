"""The tiers a Checkpointer saves to and resumes from: its run directory, and its mirror.

Without a mirror this is the run directory alone; with one, the uploader
(:mod:`statekeeper.loop.mirror.uploader`), built by :meth:`RunTiers.open` only once the
Checkpointer holds the run's writer lock: a Checkpointer that the lock refuses never reads
the upload journal nor speaks to the mirror.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statekeeper.catalog.info import RestoreInfo
from statekeeper.catalog.listing import clean_up
from statekeeper.checkpoint.load import Strict, load
from statekeeper.checkpoint.scope import Scope, is_distributed
from statekeeper.loop.mirror.config import Mirror, MirrorStatus, require_single_process
from statekeeper.loop.mirror.uploader import Uploader
from statekeeper.loop.resume import newest_intact
from statekeeper.state.optimizer import OptimizerChange
from statekeeper.storage.base import Storage

__all__ = ["RunTiers"]


class RunTiers:
    """``storage`` and, with ``mirror``, its uploader (a single-process run only)."""

    def __init__(self, storage: Storage, mirror: Mirror | None, distributed: bool) -> None:
        if mirror is not None:
            require_single_process(distributed)
        self.storage = storage
        self._mirror = mirror
        self.uploader: Uploader | None = None

    def open(self) -> None:
        """Build the uploader (the steps the journal holds are resumed): under the lock."""
        if self._mirror is not None:
            self.uploader = Uploader(self.storage, self._mirror)

    def restore(
        self,
        state: Mapping[str, Any],
        *,
        leader: bool,
        strict: Strict,
        scope: Scope,
        on_optimizer_change: OptimizerChange,
    ) -> RestoreInfo | None:
        """The newest intact step of the tiers, loaded into ``state``; the leader first
        removes interrupted saves and puts back a committed copy an overwrite set aside."""
        if leader:
            clean_up(self.storage)
        options: dict[str, Any] = {
            "strict": strict, "scope": scope, "on_optimizer_change": on_optimizer_change
        }  # fmt: skip
        if self.uploader is None:
            return newest_intact([self.storage], state, **options)
        return self.uploader.restore(state, **options)

    def load(self, state: Mapping[str, Any], step: int | None, **options: Any) -> RestoreInfo:
        """``step`` (None: the newest committed one) loaded into ``state``: from the run
        directory, or, with a mirror, from the tier that holds it (the local one first).
        Nothing is skipped: a damaged step raises, as :func:`statekeeper.load` does."""
        if self.uploader is None:
            return load(self.storage, state, step=step, **options)
        return self.uploader.load(state, step, **options)

    def before_save(self) -> None:
        """Warn about uploads that failed since the last save."""
        if self.uploader is not None:
            self.uploader.warn_new_failures()

    def committed(self, step: int, scope: Scope) -> None:
        """Hand the committed ``step`` to the uploader (torch.distributed may have begun
        since the Checkpointer was made: refused then)."""
        if self.uploader is not None:
            require_single_process(is_distributed(scope), step)
            self.uploader.submit(step)

    def wait(self) -> None:
        if self.uploader is not None:
            self.uploader.wait()

    def status(self) -> MirrorStatus | None:
        return None if self.uploader is None else self.uploader.status()

    def pending(self) -> set[int]:
        """The steps waiting for their upload (local retention keeps them)."""
        return set() if self.uploader is None else self.uploader.pending()

    def finish(self, *, quiet: bool) -> None:
        """``close()``'s wait for the uploads (see :meth:`Uploader.finish`)."""
        if self.uploader is not None:
            self.uploader.finish(quiet=quiet)
