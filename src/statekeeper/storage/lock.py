"""The writer lock of a local run directory: an exclusive ``flock`` on a file inside it.

The lock belongs to the writing *process*: a child forked while a save holds it (DataLoader
workers, a background save's thread at work while the loop forks) holds nothing, so it can
neither pin the lock past its parent's release nor be named as a writer. Three parts make
it:

- ``flock(fd, LOCK_EX | LOCK_NB)`` on one descriptor: exclusive across processes and across
  open files (a second ``open`` of the file, in this process or another, is refused),
  released by the kernel when the holder dies, untouched when some other descriptor of the
  file is closed (a backup that copies the run directory, a ``tar`` of it, a reader of the
  holder's name). The same lock as every earlier release, so two releases never write at
  once during an upgrade;
- ``os.register_at_fork``: a forked child closes its inherited copy of the descriptor at
  once, so the lock is again held by one descriptor alone, the parent's, and goes when the
  parent lets it go. (A fork made from C without Python's fork hooks keeps the copy until
  that child ends or executes a program: the descriptor is ``O_CLOEXEC``.)
- an in-process registry keyed by the lock file's ``(st_dev, st_ino)`` under one mutex, so
  that another object or thread of the holding process is refused by name ("another writer
  of this process") before it opens anything.

(A POSIX record lock, ``lockf``, is not inherited by a fork, but the kernel drops it when
the process closes *any* descriptor of the file: one ``shutil.copytree`` of the run
directory let a second writer in. It was used briefly and given up for that reason.)
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import threading
import time
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
    exclusive: bool = False  # taken by one save alone: not re-entered, even by its owner


_mutex = threading.Lock()
_held: dict[tuple[int, int], _Held] = {}
_generation = 0  # bumped in every forked child: what the parent held is not the child's


def _forked() -> None:
    """In a forked child: nothing is held; the inherited descriptors are closed now, so the
    parent's ``flock`` is held by the parent's descriptor alone."""
    global _mutex, _generation
    _mutex = threading.Lock()  # the parent's may have been held by another thread
    for held in _held.values():
        with suppress(OSError):
            os.close(held.fd)
    _held.clear()
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


EXEC_WAIT = 10.0
"""How long a lock that names this process, but that no object of it holds, is waited for
(see :func:`_after_exec`)."""


def _after_exec(fd: int) -> bool:
    """Take the lock that this process released a moment ago but a child of it still holds:
    a child being started by ``subprocess`` (``git status``, a logger's helper, any library's)
    gets a copy of every descriptor between its fork and its exec, where the close-on-exec
    copy goes, and with it the lock. Python's fork hooks close it in an ``os.fork`` child,
    not in these. Waits at most :data:`EXEC_WAIT` seconds; False if it is still held then
    (a child forked from C that lives on, or a descriptor leaked)."""
    deadline = time.monotonic() + EXEC_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.001)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        return True
    return False


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
    def held(self, *, exclusive: bool = False) -> Iterator[None]:
        """Hold the lock. ``exclusive``: for one save alone (``statekeeper.save``), refused
        while this object holds it already (a Checkpointer, another save still running), and
        refusing every re-entry while it is held (a clean-up would remove its partial entry)."""
        with _mutex:
            mine = self._mine()
            if mine is not None and (exclusive or mine.exclusive):
                raise _conflict(
                    self._root,
                    f"this process (pid {os.getpid()}): a save through the same storage object "
                    "is still running, or a Checkpointer on it is open; wait for that save "
                    "(PendingSave.wait()) or close the Checkpointer first",
                )
            if mine is None:
                mine = self._acquire()
                mine.exclusive = exclusive
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
                        os.close(mine.fd)  # the last descriptor of the lock's open file: released

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
            if other is not None:  # refused by name, before any open
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
            os.close(fd)  # only if the file was swapped between the stat and the open
            raise _conflict(self._root, f"another writer of this process (pid {os.getpid()})")
        record = f"pid {os.getpid()} on {socket.gethostname()}\n".encode()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK):
                os.close(fd)
                raise
            holder = os.pread(fd, 512, 0)
            if holder != record or not _after_exec(fd):
                os.close(fd)  # a descriptor of our own, which holds nothing
                text = holder.decode(errors="replace").strip()
                raise _conflict(self._root, text or "another writer") from None
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
