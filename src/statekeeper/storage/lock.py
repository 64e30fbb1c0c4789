"""The writer lock of a local run directory: a POSIX record lock on a file inside it.

The lock belongs to a *process*, never to an open file description: a child forked while a
save holds it (DataLoader workers, a background save's thread at work while the loop
forks) holds nothing, so it can neither pin the lock past its parent's release nor be named
as a writer. Three parts make it:

- ``fcntl.lockf(fd, LOCK_EX | LOCK_NB)`` (``F_SETLK`` on the whole file): exclusive across
  processes, not inherited by ``fork``, released by the kernel when the holder dies;
- an in-process registry keyed by the lock file's ``(st_dev, st_ino)`` under one mutex:
  POSIX locks never conflict within one process, so the registry makes the lock exclusive
  across objects and threads of the holder (a second ``Checkpointer`` on the same run
  directory in the same process is refused, as another process is);
- ``os.register_at_fork``: a forked child starts with an empty registry.

POSIX locks go when the process closes *any* descriptor of the file, so while the lock is
held nothing here opens the lock file again: the holder's name is read through the same
descriptor, and a second object only ``stat``s the path before it finds the registry entry.
The descriptor is ``O_CLOEXEC``: a program the process executes never inherits it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from statekeeper.errors import WriterConflictError

__all__ = ["LOCK_FILE", "RunLock"]

LOCK_FILE = ".statekeeper.lock"


@dataclass
class _Held:
    fd: int
    owner: RunLock
    depth: int


_mutex = threading.Lock()
_held: dict[tuple[int, int], _Held] = {}
_generation = 0  # bumped in every forked child: what the parent held is not the child's


def _forked() -> None:
    """In a forked child: nothing is held (POSIX locks are not inherited); the inherited
    descriptors are closed now, before the child can take a lock of its own."""
    global _mutex, _generation
    _mutex = threading.Lock()  # the parent's may have been held by another thread
    for held in _held.values():
        with suppress(OSError):
            os.close(held.fd)
    _held.clear()
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _conflict(root: Path, holder: str) -> WriterConflictError:
    return WriterConflictError(
        f"{root} is being written by {holder}; only one writer may save into a run directory "
        "at a time. Stop the other writer (or close the other Checkpointer, wait for its "
        "background save) or save into another directory."
    )


class RunLock:
    """Reentrant for this object (from any thread); exclusive against every other process
    and every other object of this process.

    The lock file names its holder (``pid N on HOST``), so that a refused writer is told who
    holds it. The lock goes when the holding process does, however it ends.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._key: tuple[int, int] | None = None
        self._generation = -1

    def _mine(self) -> _Held | None:
        """This object's registry entry, when it holds the lock in this process."""
        if self._key is None or self._generation != _generation:
            return None
        held = _held.get(self._key)
        return held if held is not None and held.owner is self else None

    @contextmanager
    def held(self) -> Iterator[None]:
        with _mutex:
            mine = self._mine()
            if mine is None:
                mine = self._acquire()
            mine.depth += 1
            generation = _generation
        try:
            yield
        finally:
            with _mutex:
                if generation == _generation and self._mine() is mine:
                    mine.depth -= 1
                    if mine.depth == 0:
                        del _held[self._key]  # type: ignore[arg-type]
                        self._key = None
                        os.close(mine.fd)  # closing releases the record lock

    def _acquire(self) -> _Held:
        """Take the lock (the caller holds ``_mutex``); ``WriterConflictError`` when another
        object of this process or another process holds it."""
        path = self._root / LOCK_FILE
        try:
            st = os.stat(path)
        except FileNotFoundError:
            pass
        else:
            other = _held.get((st.st_dev, st.st_ino))
            if other is not None:  # never open the file: that would drop the holder's lock
                raise _conflict(
                    self._root,
                    f"another writer of this process (pid {os.getpid()}: another Checkpointer "
                    "or save on the same run directory, not yet closed or finished)",
                )
        self._root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if key in _held:  # created between the stat and the open, by a holder here
            os.close(fd)  # unreachable unless the file was swapped: this process holds it
            raise _conflict(self._root, f"another writer of this process (pid {os.getpid()})")
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                raise
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
            os.close(fd)  # this process holds no lock on the file: nothing is dropped
            raise _conflict(self._root, holder or "another writer") from None
        record = f"pid {os.getpid()} on {socket.gethostname()}\n".encode()
        # rewritten only when it names another holder: the truncate can wait for a journal
        # commit in progress (32 ms in a profile of an async save's stall right after a
        # 1 GiB commit); the pread costs microseconds
        if os.pread(fd, len(record) + 1, 0) != record:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        held = _Held(fd, self, 0)
        _held[key] = held
        self._key = key
        self._generation = _generation
        return held
