"""What a Checkpointer holds from its construction to ``close()``, taken and given back in
order: the run's writer lock (by rank 0 in a job) first, then, under it, the mirror's
uploader (:class:`~statekeeper.loop.run_tiers.RunTiers`) and the signal handlers.
Closing finishes the background writer, then the uploads (``Mirror.close_timeout`` at most),
then puts the signal handlers back and releases the lock last. A construction that fails
half-way gives back what it took."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from contextlib import ExitStack

from statekeeper.catalog.paths import writer_lock
from statekeeper.checkpoint.async_save import AsyncWriter
from statekeeper.loop.run_tiers import RunTiers
from statekeeper.loop.signals import SignalWatch
from statekeeper.storage.base import Storage

__all__ = ["Held"]


class Held:
    """The lock of ``storage`` (with ``leader``), ``tiers`` opened under it, a
    :class:`SignalWatch` of ``signals`` (None without any) and the background ``writer``."""

    def __init__(
        self,
        storage: Storage,
        *,
        leader: bool,
        tiers: RunTiers,
        signals: Sequence[signal.Signals],
        writer: AsyncWriter | None,
    ) -> None:
        self._stack = ExitStack()
        self._tiers = tiers
        self.writer = writer
        if leader:
            self._stack.enter_context(writer_lock(storage))  # errors name the fix
        try:  # only the lock's holder reads the upload journal and speaks to the mirror
            tiers.open()
            self.watch = SignalWatch(signals) if signals else None
        except BaseException:
            self._stack.close()  # the writer lock is not kept by a Checkpointer never made
            raise
        if self.watch is not None:  # closed first: the handlers installed before come back
            self._stack.callback(self.watch.close)

    def close(self, *, quiet_uploads: bool) -> None:
        """Finish the background writer (its failure is raised first, the uploads' only
        warned about then), the uploads, then give back the handlers and the lock."""
        try:
            try:
                if self.writer is not None:
                    self.writer.close()  # waits, and stops the writer's thread
            except BaseException:
                self._tiers.finish(quiet=True)
                raise
            self._tiers.finish(quiet=quiet_uploads)
        finally:
            self._stack.close()  # the signal handlers, then the writer lock
