"""Long-lived worker threads for the short jobs of a save or a load: a chunk hashed while it
is written, a step's files verified while it is decoded, a framework's files flushed while
the step is written.

Why long-lived and shared by name (a *lane*): on CPython before 3.12 a thread that ends
while another thread forks can leave the child deadlocked (gh-112275: the exiting thread
holds the interpreter's thread-list lock, and the child takes it before resetting it). A
training loop forks often (DataLoader workers start at each epoch, right after the save at
the epoch's end), so a save that started and joined a thread of its own made that race a
hang of the next epoch's first batch. A lane's threads start on first use and never end
before the interpreter does; a forked child starts lanes of its own when it needs them.

A lane runs its jobs in order, on ``workers`` threads (started as they are needed). A job
must not wait for another job of its own lane.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["drain", "lane"]

_lanes: dict[str, ThreadPoolExecutor] = {}
_mutex = threading.Lock()


def lane(name: str, workers: int = 1) -> ThreadPoolExecutor:
    """The process's lane ``name`` (threads named ``statekeeper-<name>``), started on first
    use with ``workers`` threads at most; never shut down by statekeeper."""
    with _mutex:
        pool = _lanes.get(name)
        if pool is None:
            pool = ThreadPoolExecutor(workers, thread_name_prefix=f"statekeeper-{name}")
            _lanes[name] = pool
        return pool


def drain(name: str, timeout: float = 300.0) -> None:
    """Wait until every job handed to lane ``name`` so far has ended (the tests' seam for a
    background save whose ``PendingSave`` was dropped on purpose). Each of the lane's
    workers runs one marker job, all at once: no earlier job can still be running then.

    Raises:
        TimeoutError: The lane's jobs did not end within ``timeout`` seconds (a hang guard).
    """
    with _mutex:
        pool = _lanes.get(name)
    if pool is None:
        return
    workers = pool._max_workers  # (the executor's own count; no public accessor)
    together = threading.Barrier(workers + 1)
    markers = [pool.submit(together.wait, timeout) for _ in range(workers)]
    try:
        together.wait(timeout)
    except threading.BrokenBarrierError:
        raise TimeoutError(f"the {name} lane's jobs did not end within {timeout:g} s") from None
    for marker in markers:
        marker.result()


def _forked() -> None:
    """In a forked child: the parent's threads are not here; its lanes are forgotten (and
    the mutex, which a parent's thread may have held, is new)."""
    global _mutex
    _mutex = threading.Lock()
    _lanes.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
