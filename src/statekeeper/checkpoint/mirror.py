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
``close()``, and never blocks training: the next steps upload as usual. A step waiting for
its upload is never deleted by the local tier's retention. After each upload the mirror's
own retention policy (``Mirror.keep``) applies to the mirror.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from statekeeper.checkpoint.incremental import Reuser, previous_step
from statekeeper.checkpoint.location import PathOrStorage, committed, resolve_storage
from statekeeper.checkpoint.naming import step_entry
from statekeeper.checkpoint.policies import Retention
from statekeeper.checkpoint.retention import apply_retention
from statekeeper.errors import (
    CorruptCheckpointError,
    InvalidArgumentError,
    MirrorError,
    StatekeeperError,
)
from statekeeper.format.checksum import Buffer, Hasher
from statekeeper.format.manifest import MANIFEST, FileRecord, Manifest
from statekeeper.storage.base import Storage, Transaction

__all__ = ["Mirror", "MirrorStatus", "Uploader"]

_PIECE = 8 << 20  # bytes handed to the store per write call


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
        if not isinstance(self.backoff, int | float) or self.backoff < 0:
            raise InvalidArgumentError(f"Mirror backoff must be seconds >= 0, got {self.backoff!r}")


@dataclass(frozen=True)
class MirrorStatus:
    """Where the uploads stand: steps waiting, the one being uploaded, the newest uploaded,
    and the steps whose upload failed (with why)."""

    where: str
    waiting: tuple[int, ...]
    uploading: int | None
    uploaded: int | None
    failed: dict[int, str] = field(default_factory=dict)


def _pieces(data: Buffer, hasher: Hasher) -> Iterator[memoryview]:
    view = memoryview(data).cast("B")
    for start in range(0, len(view), _PIECE):
        piece = view[start : start + _PIECE]
        hasher.update(piece)
        yield piece


class Uploader:
    """Copies committed steps of ``local`` to ``mirror`` on a thread of its own."""

    def __init__(self, local: Storage, mirror: Mirror) -> None:
        self.local = local
        self.mirror = mirror
        self.remote = resolve_storage(mirror.target)
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()
        self._uploading: int | None = None
        self._uploaded: int | None = None
        self._failed: dict[int, BaseException] = {}
        self._unreported: list[int] = []
        self._unwarned: list[int] = []
        self._thread: threading.Thread | None = None

    def submit(self, step: int) -> None:
        """Upload committed ``step`` after those already waiting."""
        with self._cond:
            if step not in self._queue and step != self._uploading:
                self._queue.append(step)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="statekeeper-mirror", daemon=False
                )
                self._thread.start()
            self._cond.notify_all()

    def pending(self) -> set[int]:
        """Steps waiting for their upload or being uploaded (local retention keeps them)."""
        with self._cond:
            return {*self._queue, *([] if self._uploading is None else [self._uploading])}

    def status(self) -> MirrorStatus:
        with self._cond:
            return MirrorStatus(
                self.remote.describe(),
                tuple(self._queue),
                self._uploading,
                self._uploaded,
                {s: f"{type(e).__name__}: {e}" for s, e in self._failed.items()},
            )

    def new_failures(self) -> list[tuple[int, BaseException]]:
        """Failures not yet returned by this call (the Checkpointer warns about them)."""
        with self._cond:
            found, self._unwarned = self._unwarned, []
            return [(s, self._failed[s]) for s in found if s in self._failed]

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
                f"uploading to {self.remote.describe()} failed ({detail}). These steps are "
                "intact on the local tier; later steps were uploaded as usual",
                [s for s, _ in errors],
            ) from errors[-1][1]

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._thread = None
                    self._cond.notify_all()
                    return
                step = self._queue.popleft()
                self._uploading = step
            error: BaseException | None = None
            try:
                self._upload(step)
            except Exception as exc:  # kept, warned about and raised by wait(): never lost
                error = exc
            with self._cond:
                self._uploading = None
                if error is None:
                    self._failed.pop(step, None)
                    self._uploaded = step if self._uploaded is None else max(self._uploaded, step)
                else:
                    self._failed[step] = error
                    self._unreported.append(step)
                    self._unwarned.append(step)
                self._cond.notify_all()

    def _retrying(self, attempt: Callable[[], None]) -> None:
        for n in range(self.mirror.retries + 1):
            try:
                attempt()
                return
            except CorruptCheckpointError:
                raise  # the local copy is damaged: no retry can help
            except (OSError, StatekeeperError):
                if n == self.mirror.retries:
                    raise
                time.sleep(self.mirror.backoff * 2**n)

    def _copy(
        self, txn: Transaction, reuser: Reuser, entry: str, name: str, record: FileRecord
    ) -> None:
        if reuser.reuse_known(name, record) is not None:
            return  # the mirror's previous step has it: copied by the store
        data = self.local.read(entry, name)

        def once() -> None:
            hasher = Hasher()
            txn.write_chunks(name, _pieces(data, hasher))
            if (hasher.size, hasher.hexdigest()) != (record.size, record.checksum):
                raise CorruptCheckpointError(
                    self.local.describe(entry, name),
                    "differs from the checksum its manifest records: not uploaded",
                )

        self._retrying(once)

    def _upload(self, step: int) -> None:
        entry = step_entry(step)
        raw = self.local.read(entry, MANIFEST)
        manifest_bytes = bytes(raw)
        manifest = Manifest.from_bytes(self.local.describe(entry, MANIFEST), manifest_bytes)
        exists = any(p.step == step for p in committed(self.remote))
        with self.remote.writer_lock():
            txn = self.remote.begin(entry, replace=exists)
            try:
                reuser = Reuser(self.remote, txn, previous_step(self.remote, step), {})
                with ThreadPoolExecutor(self.mirror.concurrency, "statekeeper-upload") as pool:
                    jobs = [
                        pool.submit(self._copy, txn, reuser, entry, name, record)
                        for name, record in sorted(manifest.files.items())
                    ]
                    for job in jobs:
                        job.result()
                self._retrying(lambda: txn.write(MANIFEST, manifest_bytes))
                txn.commit()
            except BaseException:
                txn.abort()
                raise
            reuser.committed(entry, dict(manifest.files), {})
            if self.mirror.keep is not None:
                apply_retention(self.remote, self.mirror.keep, protect={step})
