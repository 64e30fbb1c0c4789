"""Cyclic garbage collection held off while a step is read or written.

Reading or writing a step creates tens of thousands of small objects (manifest records,
header entries, tensor views) that live until the call returns and are then freed by
reference counting: none of them is cyclic garbage. With the collector on, they survive
the young generations while the call runs and are promoted, which soon triggers a *full*
collection of the whole process: about 110 ms for a process holding 256,000 objects (a
model of 3,304 tensors and torch itself), every second load of ``bench/io.py``'s state, for
nothing found. Holding the collector off for the call avoids that work instead of moving
it: what the call allocated is gone before the collector runs again. Calls may nest and
run in several threads at once; the collector is switched back on when the last one ends,
and only if it was on before the first one began.

Scope: the calling thread's call only (a blocking save, a load, ``read``, and the caller's
part of a background save; never a background write, which runs while the training loop
does). It pays where a call makes many objects: ``bench/gc_pause.py`` (20,000 small
tensors, 200,000 other live objects) measured saves 1.1-1.8x and loads 1.6-1.8x faster with
the pause, and no difference beyond noise for 4 tensors of 64 MiB (too few objects for a
collection to start: the pause costs nothing there either). The collector is process-wide,
so other threads' cyclic garbage waits for the end of the call (collected then).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
