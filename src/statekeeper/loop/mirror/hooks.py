"""The uploaders' process hooks: interpreter exit finishes (or reports) what a process that
never called ``close()`` had queued, within ``Mirror.close_timeout``, before
``concurrent.futures`` refuses new work; a forked child starts its uploaders afresh and
never writes the journal (the parent goes on uploading what it had queued)."""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  its exit hook first: ours is run before it
import os
import threading
import weakref
from typing import Protocol

__all__ = ["track"]


class Tracked(Protocol):
    def at_exit(self) -> None: ...

    def after_fork_in_child(self) -> None: ...


_tracked: weakref.WeakSet[Tracked] = weakref.WeakSet()


def track(uploader: Tracked) -> None:
    """Run ``uploader``'s hooks at interpreter exit and in a forked child."""
    _tracked.add(uploader)


def _at_exit() -> None:
    for uploader in list(_tracked):
        uploader.at_exit()


def _after_fork_in_child() -> None:
    for uploader in list(_tracked):
        uploader.after_fork_in_child()


# run by threading's shutdown, before concurrent.futures' own hook (registered earlier: the
# hooks run last-registered first), so that thread pools still take work
threading._register_atexit(_at_exit)  # type: ignore[attr-defined]

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
