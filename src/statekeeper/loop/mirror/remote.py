"""The mirror as a restore reads it: every request retried, and a decision bounded in time.

:class:`Retrying` is a storage whose read-side requests (listing, reading a file, its
size) are retried with backoff (:class:`~statekeeper.loop.mirror.upload.Transfer`): one
failed request of a store is never taken for a missing step. :func:`within` runs a call on
a helper thread and gives up waiting after a number of seconds (the call, bounded by its
client's own timeouts, ends on its own later), so that a store that accepts connections
and never answers costs a stated time, not its client's minutes.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from statekeeper.catalog.location import resolve_storage
from statekeeper.errors import InvalidArgumentError, StorageError
from statekeeper.loop.mirror.config import Mirror
from statekeeper.loop.mirror.upload import Transfer
from statekeeper.storage.base import Storage, Transaction
from statekeeper.storage.fsspec import FsspecStorage
from statekeeper.storage.optional import Capabilities, capabilities_of
from statekeeper.storage.places import same_place

__all__ = ["Retrying", "mirror_storage", "within"]

T = TypeVar("T")


class Retrying:
    """``storage`` with every read-side request tried again by ``transfer`` after a failure
    of the store (``OSError``; a missing file and a damaged one are final)."""

    def __init__(self, storage: Storage, transfer: Transfer) -> None:
        self.storage = storage
        self._transfer = transfer

    @property
    def capabilities(self) -> Capabilities:
        return capabilities_of(self.storage)

    def describe(self, entry: str = "", name: str = "") -> str:
        return self.storage.describe(entry, name)

    def exists(self) -> bool:
        found = getattr(self.storage, "exists", None)
        return True if found is None else bool(self._transfer.attempt(found))

    def entries(self) -> list[str]:
        return self._transfer.attempt(self.storage.entries)

    def files(self, entry: str) -> list[str]:
        return self._transfer.attempt(lambda: self.storage.files(entry))

    def top_level(self) -> list[str] | None:
        """The storage's ``top_level()`` (see :mod:`statekeeper.loop.mirror.candidates`),
        or None where it has none."""
        top = getattr(self.storage, "top_level", None)
        return None if not callable(top) else list(self._transfer.attempt(top))

    def is_committed(self, entry: str) -> bool:
        check = getattr(self.storage, "is_committed", None)
        return True if not callable(check) else bool(self._transfer.attempt(lambda: check(entry)))

    def read(self, entry: str, name: str) -> Any:
        return self._transfer.attempt(lambda: self.storage.read(entry, name))

    def size(self, entry: str, name: str) -> int:
        return self._transfer.attempt(lambda: self.storage.size(entry, name))

    def begin(self, entry: str, *, replace: bool = False) -> Transaction:
        return self.storage.begin(entry, replace=replace)

    def remove(self, entry: str) -> None:
        self._transfer.attempt(lambda: self.storage.remove(entry))  # none once stopped

    def writer_lock(self) -> AbstractContextManager[None]:
        return self.storage.writer_lock()


def mirror_storage(local: Storage, mirror: Mirror) -> Storage:
    """The storage of ``mirror.directory``: refused where it is ``local`` itself (however
    spelled); an fsspec store through a client whose requests are bounded by
    ``Mirror.timeout`` (:meth:`FsspecStorage.with_timeout`: S3)."""
    remote = resolve_storage(mirror.directory)
    if same_place(remote, local):
        raise InvalidArgumentError(
            f"the mirror {remote.describe()} is the run directory {local.describe()} "
            "itself (the same directory, however spelled): its retention would delete "
            "the run's own steps. Mirror to another storage"
        )
    return remote.with_timeout(mirror.timeout) if isinstance(remote, FsspecStorage) else remote


def within(seconds: float, call: Callable[[], T], what: str) -> T:
    """``call()``, or ``StorageError`` (``ETIMEDOUT``) when it has not returned after
    ``seconds``; its own exception otherwise. The call goes on, on a daemon thread, until
    its client's timeouts end it."""
    result: list[T] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # handed to the caller
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="statekeeper-mirror-request", daemon=True).start()
    if not done.wait(seconds):
        raise StorageError(errno.ETIMEDOUT, f"{what}: no answer within {seconds:g} s")
    if failure:
        raise failure[0]
    return result[0]
