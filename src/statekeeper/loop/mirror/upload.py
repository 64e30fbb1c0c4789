"""Copying one committed step to another storage with that storage's commit protocol.

Every tensor file first, each checked while it streams against the checksum its manifest
records (a local file damaged since the save is never uploaded as good); a file that the
destination's previous step holds with the same checksum is copied by the store itself;
the manifest last, byte for byte. A step the destination holds already with the same
manifest is left as it is. Each request that reaches the destination is retried on
``OSError`` (a store's failures are ``StorageError``s), waiting ``backoff`` seconds before
the first retry and doubling; a damaged local file is never retried.
"""

from __future__ import annotations

import errno
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from statekeeper.catalog.location import committed
from statekeeper.catalog.naming import step_entry
from statekeeper.errors import CorruptCheckpointError, StepNotFoundError, StorageError
from statekeeper.format.checksum import Buffer, Hasher
from statekeeper.format.manifest import MANIFEST, FileRecord, Manifest
from statekeeper.incremental.reuse import IncrementalCache, Reuser, previous_step
from statekeeper.storage.base import Storage, Transaction

__all__ = ["Transfer", "run_all", "upload_step"]

_PIECE = 8 << 20  # bytes handed to the store per write call
T = TypeVar("T")


@dataclass(frozen=True)
class Transfer:
    """How files move: at most ``concurrency`` at once, each request tried ``retries``
    more times after a failure, waiting ``backoff`` seconds before the first retry. Once
    ``stop`` is set, no request is begun or retried any more (``StorageError``,
    ``ECANCELED``)."""

    concurrency: int
    retries: int
    backoff: float
    stop: threading.Event = field(default_factory=threading.Event, compare=False)
    cache: IncrementalCache = field(default_factory=IncrementalCache, compare=False)
    """What the uploads remember of the remote's files (checked once, not again)."""

    def _check(self) -> None:
        if self.stop.is_set():
            raise StorageError(errno.ECANCELED, "stopped: the Checkpointer stopped uploading")

    def attempt(self, call: Callable[[], T]) -> T:
        for n in range(self.retries + 1):
            self._check()
            try:
                return call()
            except (CorruptCheckpointError, FileNotFoundError):
                raise  # damaged, or absent: no retry can help
            except OSError:
                if n == self.retries:
                    raise
                self.stop.wait(self.backoff * 2**n)
        raise AssertionError("unreachable")  # pragma: no cover


def _pieces(data: Buffer, hasher: Hasher) -> Iterator[memoryview]:
    view = memoryview(data).cast("B")
    for start in range(0, len(view), _PIECE):
        piece = view[start : start + _PIECE]
        hasher.update(piece)
        yield piece


def _copy(
    local: Storage,
    txn: Transaction,
    reuser: Reuser,
    entry: str,
    name: str,
    record: FileRecord,
    transfer: Transfer,
) -> None:
    if transfer.attempt(lambda: reuser.reuse_known(name, record)) is not None:
        return  # the destination's previous step has it: copied by the store
    data = local.read(entry, name)

    def once() -> None:
        hasher = Hasher()
        txn.write_chunks(name, _pieces(data, hasher))
        if (hasher.size, hasher.hexdigest()) != (record.size, record.checksum):
            raise CorruptCheckpointError(
                local.describe(entry, name),
                "differs from the checksum its manifest records: not uploaded",
            )

    transfer.attempt(once)


def run_all(jobs: list[Callable[[], None]], concurrency: int) -> None:
    """Run ``jobs``, at most ``concurrency`` at once, on daemon threads of their own (not a
    ``concurrent.futures`` pool, whose threads interpreter exit joins: a request that hangs
    and cannot be interrupted never holds the process); no job is begun after one failed.
    Returns once all begun have ended; raises the first failure."""
    waiting = deque(jobs)
    failures: list[BaseException] = []
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if failures or not waiting:
                    return
                job = waiting.popleft()
            try:
                job()
            except BaseException as exc:  # raised by run_all, in the caller's thread
                with lock:
                    failures.append(exc)

    threads = [
        threading.Thread(target=work, name="statekeeper-upload", daemon=True)
        for _ in range(min(concurrency, len(jobs)))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def _same_there(remote: Storage, entry: str, manifest_bytes: bytes, transfer: Transfer) -> bool:
    """Whether ``remote`` holds the step with these manifest bytes. A read that keeps
    failing raises: a committed copy is never replaced on a guess."""
    try:
        return bytes(transfer.attempt(lambda: remote.read(entry, MANIFEST))) == manifest_bytes
    except FileNotFoundError:
        return False


def upload_step(local: Storage, remote: Storage, step: int, transfer: Transfer) -> bool:
    """Copy committed ``step`` of ``local`` to ``remote`` and commit it there; False when
    ``remote`` held it already, byte for byte (nothing was done)."""
    entry = step_entry(step)
    try:
        manifest_bytes = bytes(local.read(entry, MANIFEST))
    except FileNotFoundError:
        raise StepNotFoundError(
            f"{local.describe(entry)} is no longer on the local tier: it cannot be uploaded"
        ) from None
    manifest = Manifest.from_bytes(local.describe(entry, MANIFEST), manifest_bytes)
    exists = transfer.attempt(lambda: any(p.step == step for p in committed(remote)))
    if exists and _same_there(remote, entry, manifest_bytes, transfer):
        return False
    with remote.writer_lock():
        txn = transfer.attempt(lambda: remote.begin(entry, replace=exists))
        try:
            previous = transfer.attempt(lambda: previous_step(remote, step))
            reuser = Reuser(remote, txn, previous, {}, transfer.cache)
            run_all(
                [
                    partial(_copy, local, txn, reuser, entry, name, record, transfer)
                    for name, record in sorted(manifest.files.items())
                ],
                transfer.concurrency,
            )
            transfer.attempt(lambda: txn.write(MANIFEST, manifest_bytes))
            transfer.attempt(txn.commit)
        except BaseException:
            if not transfer.stop.is_set():  # stopped: the run may be another process's now
                txn.abort()
            raise
    reuser.committed(entry, dict(manifest.files), {})
    return True
