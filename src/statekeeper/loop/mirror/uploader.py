"""The uploader: copies committed steps of the local tier to a :class:`Mirror` on a thread
of its own (see :mod:`statekeeper.loop.mirror.config` for what a mirror promises).

The steps not uploaded yet are recorded in the run directory's upload journal
(:mod:`statekeeper.catalog.journal`): a process killed mid-upload leaves them there, and
the next uploader for the same mirror queues them first (its local retention keeps them
until they are uploaded). ``finish`` (``close()``) waits at most ``Mirror.close_timeout``
seconds, whatever the back-end (a request that hangs and cannot be interrupted included:
the uploads run on daemon threads that never hold the process), and stops at the first
upload that fails while closing; what is still waiting then is warned about and stays in
the journal. From then on the uploader changes nothing of the run (no journal write, no
request begun, no retention on the mirror): the next owner of the run may already be at
work. A process that ends without ``close()`` does the same at interpreter exit
(:mod:`statekeeper.loop.mirror.hooks`).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any

from statekeeper.catalog.info import RestoreInfo
from statekeeper.catalog.journal import Journal
from statekeeper.catalog.location import committed
from statekeeper.checkpoint.load import Strict
from statekeeper.checkpoint.scope import Scope
from statekeeper.errors import (
    MirrorError,
    StatekeeperWarning,
)
from statekeeper.loop.mirror.config import Mirror, MirrorStatus
from statekeeper.loop.mirror.hooks import track
from statekeeper.loop.mirror.remote import Retrying, mirror_storage
from statekeeper.loop.mirror.reports import (
    RETRY_STEPS,
    failed_uploads,
    warn_failure,
    warn_gone,
    warn_left,
    warn_retention,
)
from statekeeper.loop.mirror.tiered import load_of_tiers, newest_of_tiers
from statekeeper.loop.mirror.upload import Transfer, upload_step
from statekeeper.loop.retention import apply_retention
from statekeeper.state.optimizer import OptimizerChange
from statekeeper.storage.base import Storage

__all__ = ["RETRY_STEPS", "Uploader"]


class Uploader:
    """Copies committed steps of ``local`` to ``mirror`` on a thread of its own."""

    def __init__(self, local: Storage, mirror: Mirror) -> None:
        self.local = local
        self.mirror = mirror
        self.remote = remote = mirror_storage(local, mirror)
        self.reader = Retrying(remote, Transfer(1, mirror.retries, mirror.backoff))
        self.journal = Journal(local, remote.describe())
        # held while the thread runs the mirror's retention, and (the other) while anyone
        # writes the journal: once ``_disowned`` is set under both, nothing of the run is
        # changed by this uploader again. Two locks: a save that records its step in the
        # journal never waits for a retention on the mirror
        self._owner_lock = threading.Lock()
        self._journal_lock = threading.Lock()
        self._reset()
        self._resume()
        track(self)  # loop/mirror/hooks.py: interpreter exit, fork

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._transfer = Transfer(self.mirror.concurrency, self.mirror.retries, self.mirror.backoff)
        self._queue: deque[int] = deque()
        self._uploading: int | None = None
        self._uploaded: int | None = None
        self._failed: dict[int, BaseException] = {}
        self._attempts: dict[int, int] = {}
        self._unreported: list[int] = []
        self._unwarned: list[int] = []
        self._thread: threading.Thread | None = None
        self._closing = False  # while closing, a failed upload stops the ones after it
        self._halted = False
        self._finished = False
        self._disowned = False  # closed: the run (its lock, its journal) is no longer ours

    def _resume(self) -> None:
        """Queue the steps an earlier process left in the journal (uploaded from the next
        ``submit``, ``restore``, ``wait`` or ``finish`` on: this process holds the run's lock
        by then)."""
        waiting = self.journal.read()
        if not waiting:
            return
        present = {p.step for p in committed(self.local)}
        gone = sorted(waiting - present)
        if gone:
            warn_gone(gone, self.local.describe(), self.remote.describe())
        self._queue.extend(sorted(waiting & present))

    def _record(self) -> None:
        """The journal follows what is waiting (called without the condition held). The
        set is taken and written under one lock: a writer that saw an older set (the
        thread, before a save queued a step) never writes it over a newer one; once
        :meth:`finish` disowned the run, never again (the next owner's journal is its own)."""
        with self._journal_lock:
            if not self._disowned:
                self.journal.write(self.pending())

    def _start(self) -> None:
        """Start the thread when there is work and none runs (the condition is held)."""
        if self._thread is None and self._queue and not self._halted:
            # a daemon: interpreter exit waits for it through the exit hook, within a bound
            thread = threading.Thread(target=self._run, name="statekeeper-mirror", daemon=True)
            thread.start()
            self._thread = thread

    def submit(self, step: int) -> None:
        """Upload committed ``step`` after those already waiting, and try again the steps
        whose upload failed (each at most ``RETRY_STEPS`` times)."""
        with self._cond:
            retry = [s for s in self._failed if self._attempts.get(s, 0) < RETRY_STEPS]
            for s in (*sorted(retry), step):
                if s not in self._queue and s != self._uploading:
                    self._queue.append(s)
            self._start()
            self._cond.notify_all()
        self._record()

    def pending(self) -> set[int]:
        """Steps not on the mirror yet that will be tried again: waiting, being uploaded,
        or failed with tries left. Local retention keeps them."""
        with self._cond:
            retry = {s for s in self._failed if self._attempts.get(s, 0) < RETRY_STEPS}
            current = [] if self._uploading is None else [self._uploading]
            return {*self._queue, *current, *retry}

    def status(self) -> MirrorStatus:
        with self._cond:
            return MirrorStatus(
                self.remote.describe(),
                tuple(self._queue),
                self._uploading,
                self._uploaded,
                {s: f"{type(e).__name__}: {e}" for s, e in self._failed.items()},
            )

    def restore(
        self,
        state: Mapping[str, Any],
        *,
        strict: Strict,
        scope: Scope,
        on_optimizer_change: OptimizerChange,
    ) -> RestoreInfo | None:
        """The newest step of either tier, loaded into ``state`` (see
        :mod:`statekeeper.loop.mirror.tiered`); the steps left in the journal start
        uploading."""
        try:
            return newest_of_tiers(
                self.local, self.reader, self.mirror, state, strict=strict, scope=scope,
                on_optimizer_change=on_optimizer_change,
            )  # fmt: skip
        finally:
            with self._cond:
                self._start()

    def load(self, state: Mapping[str, Any], step: int | None, **options: Any) -> RestoreInfo:
        """``step`` (None: the newest) of either tier, loaded into ``state`` (see
        :func:`~statekeeper.loop.mirror.tiered.load_of_tiers`); the steps left in the
        journal start uploading."""
        try:
            return load_of_tiers(self.local, self.reader, self.mirror, state, step, **options)
        finally:
            with self._cond:
                self._start()

    def warn_new_failures(self) -> None:
        """A ``StatekeeperWarning`` for each failure not warned about yet."""
        with self._cond:
            found, self._unwarned = self._unwarned, []
            failures = [(s, self._failed[s]) for s in found if s in self._failed]
        for step, exc in failures:
            warn_failure(step, self.remote.describe(), exc)

    def _idle(self, deadline: float | None) -> bool:
        """Wait until the thread has ended (nothing queued, or halted); False when the
        ``time.monotonic()`` ``deadline`` passed first."""
        with self._cond:
            self._start()
            while self._thread is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _raise_failures(self) -> None:
        with self._cond:
            failed, self._unreported = self._unreported, []
            errors = [(s, self._failed[s]) for s in failed if s in self._failed]
        if errors:
            raise failed_uploads(self.remote.describe(), errors) from errors[-1][1]

    def wait(self) -> None:
        """Wait until every submitted step is uploaded or has failed; raise ``MirrorError``
        for the failures not reported yet (each once)."""
        self._idle(None)
        self._raise_failures()

    def finish(self, *, quiet: bool, why: str = "close()") -> None:
        """Wait for the uploads, ``Mirror.close_timeout`` seconds at most and until the first
        one that fails; warn about the steps still waiting (the journal keeps them); raise
        the failures not reported yet, or only warn about them with ``quiet`` (an error is
        already on its way out)."""
        with self._cond:
            self._closing = True
            self._finished = True
        bound = self.mirror.close_timeout
        deadline = None if bound is None else time.monotonic() + bound
        finished = self._idle(deadline)
        settled, left = self._disown(deadline)
        if left:
            timeout = None if finished else bound
            where = self.journal.where()
            warn_left(why, self.remote.describe(), where, left, timeout, settled)
        try:
            self._raise_failures()
        except MirrorError as exc:
            if not quiet:
                raise
            warnings.warn(f"statekeeper: {exc}", StatekeeperWarning, stacklevel=2)

    def _disown(self, deadline: float | None) -> tuple[bool, list[int]]:
        """From now on nothing of the run is changed by this uploader (the writer lock is
        released next): no request is begun or retried, the journal is never written and
        the mirror's retention never runs again, whatever the thread still waits for (a
        request that cannot be interrupted). False when a change of the run the thread
        had begun was still going on at ``deadline`` (it is not waited for longer); and the
        steps not tried or not done then (a failure is raised by ``finish``, named there)."""
        self._transfer.stop.set()
        wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        retention = self._owner_lock.acquire(timeout=wait)
        wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        journal = self._journal_lock.acquire(timeout=wait)
        try:
            with self._cond:
                self._disowned = self._halted = True
                current = [] if self._uploading is None else [self._uploading]
                left = sorted({*self._queue, *current})
        finally:
            if journal:
                self._journal_lock.release()
            if retention:
                self._owner_lock.release()
        return retention and journal, left

    def at_exit(self) -> None:
        """Interpreter exit without ``close()``: finish (or report) what was started."""
        with self._cond:
            started = self._thread is not None or bool(self._unreported)
        if started and not self._finished:
            self.finish(quiet=True, why="the interpreter exits without Checkpointer.close()")

    def _run(self) -> None:
        try:
            while self._next():
                pass
        finally:  # whatever happened, nobody waits for this thread any more
            with self._cond:
                self._thread = None
                self._uploading = None
                self._cond.notify_all()

    def _next(self) -> bool:
        """Upload the next queued step; False when the queue is empty or the uploads stop."""
        with self._cond:
            if not self._queue or self._halted or self._transfer.stop.is_set():
                return False
            step = self._queue.popleft()
            self._uploading = step
            self._attempts[step] = self._attempts.get(step, 0) + 1
        error: BaseException | None = None
        try:
            upload_step(self.local, self.remote, step, self._transfer)
            with self._owner_lock:  # before wait() can return: the tier is as it will stay
                if not self._disowned:
                    self._retain(step)
        except Exception as exc:  # kept, warned about and raised by wait(): never lost
            error = exc
        with self._cond:
            if self._disowned:  # closed meanwhile: what the journal says stays as it is
                self._uploading = None
                self._cond.notify_all()
                return False
            self._uploading = None
            if error is None:
                self._failed.pop(step, None)
                self._attempts.pop(step, None)
                self._uploaded = step if self._uploaded is None else max(self._uploaded, step)
            else:
                self._failed[step] = error
                self._unreported.append(step)
                self._unwarned.append(step)
                self._halted = self._closing
            self._cond.notify_all()
        self._record()
        return True

    def _retain(self, step: int) -> None:
        """The mirror's retention; a failure there is warned about (the step is uploaded)."""
        if self.mirror.keep is None:
            return
        try:  # each removal checks that the uploads were not stopped meanwhile
            apply_retention(Retrying(self.remote, self._transfer), self.mirror.keep, {step})
        except Exception as exc:  # a policy's own bug included: the upload stands
            warn_retention(self.remote.describe(), step, exc)

    def after_fork_in_child(self) -> None:
        """A forked child has none of its parent's threads: it starts afresh and never
        writes the journal (the parent goes on uploading what it had queued)."""
        self._owner_lock = threading.Lock()  # a parent's thread may have held them
        self._journal_lock = threading.Lock()
        self._reset()
        self.journal.enabled = False
