"""A second tier: every committed step copied, in the background, to a mirror.

A Checkpointer with ``mirror=Mirror("s3://bucket/run", ...)`` commits each step on its own
(local, fast) tier as always, then hands the step to an :class:`Uploader`. The uploader's
thread copies the step to the mirror with the mirror's own commit protocol: every tensor
file first, each checked against the checksum the manifest records for it while it is
streamed (a local file damaged since the save is never uploaded as good), the manifest last,
byte for byte. A file that the mirror's previous step holds with the same checksum is copied
by the store itself (incremental). At most ``concurrency`` files move at once; a failed
transfer is retried ``retries`` times, waiting ``backoff`` seconds, doubled each time.

An upload that fails for good leaves no committed step on the mirror; it is kept, warned
about at the next save, raised (:class:`~statekeeper.errors.MirrorError`) by ``wait()`` and
``close()``, tried again with the next saves (``RETRY_STEPS`` tries in all), and never
blocks training: the next steps upload as usual. A step waiting for its upload, or failed
with tries left, is never deleted by the local tier's retention. After each upload the
mirror's own retention policy (``Mirror.keep``) applies to the mirror.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
import weakref
from collections import deque
from dataclasses import dataclass, field

from statekeeper.checkpoint.location import PathOrStorage, resolve_storage
from statekeeper.checkpoint.policies import Retention
from statekeeper.checkpoint.retention import apply_retention
from statekeeper.checkpoint.upload import Transfer, upload_step
from statekeeper.errors import (
    InvalidArgumentError,
    MirrorError,
    StatekeeperWarning,
    user_stacklevel,
)
from statekeeper.storage.base import Storage

__all__ = ["Mirror", "MirrorStatus", "Uploader"]


@dataclass(frozen=True)
class Mirror:
    """Where committed steps are copied (a URL such as ``"s3://bucket/run"``, a path, or a
    Storage), which of them the mirror keeps (``keep``; None keeps all), how many files move
    at once (``concurrency``), and how often a failed transfer is retried (``retries``,
    waiting ``backoff`` seconds before the first retry, doubling)."""

    target: PathOrStorage
    keep: Retention | None = None
    concurrency: int = 4
    retries: int = 3
    backoff: float = 0.5

    def __post_init__(self) -> None:
        if self.keep is not None and not isinstance(self.keep, Retention):
            raise InvalidArgumentError(
                f"Mirror keep must be a retention policy such as KeepEvery(10), got {self.keep!r}"
            )
        for name in ("concurrency", "retries"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgumentError(f"Mirror {name} must be an int >= 0, got {value!r}")
        if self.concurrency < 1:
            raise InvalidArgumentError("Mirror concurrency must be at least 1")
        backoff = self.backoff
        if isinstance(backoff, bool) or not isinstance(backoff, int | float):
            raise InvalidArgumentError(f"Mirror backoff must be seconds >= 0, got {backoff!r}")
        if not math.isfinite(backoff) or backoff < 0:
            raise InvalidArgumentError(f"Mirror backoff must be seconds >= 0, got {backoff!r}")


@dataclass(frozen=True)
class MirrorStatus:
    """Where the uploads stand: steps waiting, the one being uploaded, the newest uploaded,
    and the steps whose upload failed (with why)."""

    where: str
    waiting: tuple[int, ...]
    uploading: int | None
    uploaded: int | None
    failed: dict[int, str] = field(default_factory=dict)


class Uploader:
    """Copies committed steps of ``local`` to ``mirror`` on a thread of its own."""

    def __init__(self, local: Storage, mirror: Mirror) -> None:
        self.local = local
        self.mirror = mirror
        self.remote = resolve_storage(mirror.target)
        if self.remote.describe() == local.describe():
            raise InvalidArgumentError(
                f"the mirror {self.remote.describe()} is the run directory itself: mirror "
                "to another storage"
            )
        self._transfer = Transfer(mirror.concurrency, mirror.retries, mirror.backoff)
        self._reset()
        _uploaders.add(self)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()
        self._uploading: int | None = None
        self._uploaded: int | None = None
        self._failed: dict[int, BaseException] = {}
        self._attempts: dict[int, int] = {}
        self._unreported: list[int] = []
        self._unwarned: list[int] = []
        self._thread: threading.Thread | None = None

    def submit(self, step: int) -> None:
        """Upload committed ``step`` after those already waiting, and try again the steps
        whose upload failed (each at most ``RETRY_STEPS`` times)."""
        with self._cond:
            retry = [s for s in self._failed if self._attempts.get(s, 0) < RETRY_STEPS]
            for s in (*sorted(retry), step):
                if s not in self._queue and s != self._uploading:
                    self._queue.append(s)
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="statekeeper-mirror")
                thread.start()  # not a daemon: queued uploads finish before the process exits
                self._thread = thread
            self._cond.notify_all()

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

    def warn_new_failures(self) -> None:
        """A ``StatekeeperWarning`` for each failure not warned about yet."""
        with self._cond:
            found, self._unwarned = self._unwarned, []
            failures = [(s, self._failed[s]) for s in found if s in self._failed]
        for step, exc in failures:
            warnings.warn(
                f"statekeeper: uploading step {step} to {self.remote.describe()} failed "
                f"({type(exc).__name__}: {exc}); the step stays on the local tier and its "
                "upload is tried again with the next save; wait()/close() raise it",
                StatekeeperWarning,
                stacklevel=user_stacklevel(),
            )

    def wait(self) -> None:
        """Wait until every submitted step is uploaded or has failed; raise ``MirrorError``
        for the failures not reported yet (each once)."""
        with self._cond:
            while self._queue or self._uploading is not None:
                self._cond.wait()
            failed, self._unreported = self._unreported, []
            errors = [(s, self._failed[s]) for s in failed if s in self._failed]
        if errors:
            detail = "; ".join(f"step {s}: {type(e).__name__}: {e}" for s, e in errors)
            raise MirrorError(
                f"uploading to {self.remote.describe()} failed ({detail}). Later steps were "
                "uploaded as usual; a failed step stays on the local tier while its upload "
                f"is tried again (with each of the next {RETRY_STEPS} saves)",
                [s for s, _ in errors],
            ) from errors[-1][1]

    def finish(self, *, quiet: bool) -> None:
        """Wait for the uploads; their unreported failures are raised, or only warned about
        with ``quiet`` (an error is already on its way out)."""
        try:
            self.wait()
        except MirrorError as exc:
            if not quiet:
                raise
            warnings.warn(f"statekeeper: {exc}", StatekeeperWarning, stacklevel=2)

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
        """Upload the next queued step; False when the queue is empty."""
        with self._cond:
            if not self._queue:
                return False
            step = self._queue.popleft()
            self._uploading = step
            self._attempts[step] = self._attempts.get(step, 0) + 1
        error: BaseException | None = None
        try:
            upload_step(self.local, self.remote, step, self._transfer)
            self._retain(step)  # before wait() can return: the tier is as it will stay
        except Exception as exc:  # kept, warned about and raised by wait(): never lost
            error = exc
        with self._cond:
            self._uploading = None
            if error is None:
                self._failed.pop(step, None)
                self._attempts.pop(step, None)
                self._uploaded = step if self._uploaded is None else max(self._uploaded, step)
            else:
                self._failed[step] = error
                self._unreported.append(step)
                self._unwarned.append(step)
            self._cond.notify_all()
        return True

    def _retain(self, step: int) -> None:
        """The mirror's retention; a failure there is warned about (the step is uploaded)."""
        if self.mirror.keep is None:
            return
        try:
            apply_retention(self.remote, self.mirror.keep, protect={step})
        except Exception as exc:  # a policy's own bug included: the upload stands
            warnings.warn(
                f"statekeeper: retention on the mirror {self.remote.describe()} failed after "
                f"step {step} ({exc}); it runs again after the next upload",
                StatekeeperWarning,
                stacklevel=2,
            )


RETRY_STEPS = 3
"""How many times in all a step's upload is tried (once, then with each of the next saves)."""

_uploaders: weakref.WeakSet[Uploader] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: its uploaders start afresh (the
    parent goes on uploading what it had queued)."""
    for uploader in list(_uploaders):
        uploader._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
