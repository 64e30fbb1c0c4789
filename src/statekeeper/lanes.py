"""Long-lived worker threads for the short jobs of a save or a load: a chunk hashed while it
is written, a step's files verified while it is decoded, a framework's files flushed while
the step is written, a one-off background save, the ``git status`` a step's origin records.

Why long-lived and shared by name (a *lane*): on CPython before 3.12 a thread that ends
while another thread forks can leave the child deadlocked (gh-112275: the exiting thread
holds the interpreter's thread-list lock, and the child takes it before resetting it). A
training loop forks often (DataLoader workers start at each epoch, right after the save at
the epoch's end), so a save that started and joined a thread of its own made that race a
hang of the next epoch's first batch. A lane's threads start when first needed and never
end before the interpreter does; a forked child starts lanes of its own.

Why not ``concurrent.futures``: its executors refuse new work once interpreter exit has
begun, so a background save still running at exit (a Checkpointer not closed, a
``PendingSave`` not waited for) lost its step when it asked for a chunk's hash. A lane
takes work until the process ends. Its threads are daemon threads; interpreter exit waits
for the jobs of the lanes that must finish (one-off background saves: ``FINISH_AT_EXIT``).

Jobs start in the order they were handed in, each on the first free worker of its lane. A
job must not wait for another job of its own lane (with one worker, that never runs).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["FINISH_AT_EXIT", "drain", "lane"]

T = TypeVar("T")

WORKERS = {"hash": 8, "verify": 1, "flush": 1, "git": 1, "save": 4}
"""Each lane's threads at most (started as jobs need them): hashing serves every save of
the process at once (one job per save at a time); verifying, one load's files in order;
``save``, the one-off background saves written at once (more wait their turn)."""

FINISH_AT_EXIT = frozenset({"save"})
"""The lanes whose jobs interpreter exit waits for (a save in flight is finished)."""


class Lane:
    """A queue of jobs and the daemon threads that run them (see the module docstring)."""

    def __init__(self, name: str, workers: int) -> None:
        self.name = name
        self._workers = workers
        self._jobs: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._threads = 0
        self._idle = 0
        self._unfinished = 0  # handed in, not yet ended

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on this lane; its result or exception comes in the future."""
        future: Future[T] = Future()
        with self._ready:
            self._jobs.append((future, fn, args))
            self._unfinished += 1
            if self._idle == 0 and self._threads < self._workers:
                self._threads += 1
                threading.Thread(
                    target=self._work, name=f"statekeeper-{self.name}_{self._threads}", daemon=True
                ).start()
            else:
                self._ready.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._ready:
                self._idle += 1
                while not self._jobs:
                    self._ready.wait()
                self._idle -= 1
                future, fn, args = self._jobs.popleft()
            try:
                if future.set_running_or_notify_cancel():  # False: cancelled while queued
                    try:
                        future.set_result(fn(*args))
                    except BaseException as exc:  # the caller's, through the future
                        future.set_exception(exc)
            finally:
                del future, fn, args  # nothing of the job outlives it here
                with self._ready:
                    self._unfinished -= 1
                    self._ready.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every job handed in so far has ended; False if ``timeout`` passed."""
        with self._ready:
            return self._ready.wait_for(lambda: self._unfinished == 0, timeout)


_lanes: dict[str, Lane] = {}
_mutex = threading.Lock()


def lane(name: str) -> Lane:
    """The process's lane ``name`` (one of :data:`WORKERS`; threads named
    ``statekeeper-<name>_<n>``), made on first use."""
    with _mutex:
        found = _lanes.get(name)
        if found is None:
            found = _lanes[name] = Lane(name, WORKERS[name])
        return found


def drain(name: str, timeout: float = 300.0) -> None:
    """Wait until every job handed to lane ``name`` so far has ended (the tests' seam for a
    background save whose ``PendingSave`` was dropped on purpose; never from a job of that
    lane).

    Raises:
        TimeoutError: The lane's jobs did not end within ``timeout`` seconds (a hang guard).
    """
    with _mutex:
        found = _lanes.get(name)
    if found is not None and not found.drain(timeout):
        raise TimeoutError(f"the {name} lane's jobs did not end within {timeout:g} s")


def _at_exit() -> None:
    """Interpreter exit: the jobs of :data:`FINISH_AT_EXIT` lanes end first."""
    with _mutex:
        waiting = [found for name, found in _lanes.items() if name in FINISH_AT_EXIT]
    for found in waiting:
        found.drain()


def _forked() -> None:
    """In a forked child: the parent's threads are not here; its lanes are forgotten (and
    the mutex, which a parent's thread may have held, is new)."""
    global _mutex
    _mutex = threading.Lock()
    _lanes.clear()


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
