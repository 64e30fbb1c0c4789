"""Named points of a save, where a test places a kill (or any action) exactly.

A save passes these points in order (single-process saves, blocking or in the background;
the job-wide save of :mod:`statekeeper.distributed` has its own protocol and passes none):

- ``Point.BEGUN``: the in-progress entry exists, empty;
- ``Point.SHARD_WRITTEN``: one tensor file written in the in-progress entry (once per file);
- ``Point.TENSORS_WRITTEN``: every tensor file written, no manifest yet;
- ``Point.MANIFEST_WRITTEN``: the manifest written, the entry not yet committed;
- ``Point.COMMITTED``: the step committed, before retention and the save's return;
- ``Point.REMOVING``: retention (or ``keep_only``) is about to remove an older step (once per
  step it removes).

Nothing happens at a point unless a test asked for it, in one of two ways:

- in the test's own process, :func:`set_hook` registers ``hook(point)``, called at each point
  (:func:`set_hook` ``(None)`` removes it);
- in a child process, the environment variable ``STATEKEEPER_TEST_KILL_AT=<point>[:<n>]``
  (e.g. ``manifest-written`` or ``shard-written:3``) makes the process SIGKILL itself the
  ``n``-th time (default 1) it reaches ``<point>``, counting every save of the process.

The cost when neither is set is one global lookup and one ``os.environ`` lookup per point:
five per save, one per tensor file and one per step removed. This module is a test seam,
not a public API: it is not exported from ``statekeeper``, and user code should not
register hooks.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from enum import StrEnum

from statekeeper.errors import InvalidArgumentError

__all__ = ["KILL_AT", "Point", "reach", "set_hook"]

KILL_AT = "STATEKEEPER_TEST_KILL_AT"


class Point(StrEnum):
    """A named point of a save (see the module docstring)."""

    BEGUN = "begun"
    SHARD_WRITTEN = "shard-written"
    TENSORS_WRITTEN = "tensors-written"
    MANIFEST_WRITTEN = "manifest-written"
    COMMITTED = "committed"
    REMOVING = "removing"


Hook = Callable[[Point], None]
_hook: Hook | None = None
_arrivals: dict[Point, int] = {}


def set_hook(hook: Hook | None) -> Hook | None:
    """Call ``hook(point)`` at every point of every save of this process from now on
    (``None``: no more); the hook set before."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def _kill_at(spec: str) -> tuple[Point, int]:
    name, _, count = spec.partition(":")
    try:
        n = int(count or 1)
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        return Point(name), n
    except ValueError as exc:
        raise InvalidArgumentError(
            f"{KILL_AT}={spec!r}: expected <point>[:<n>] with a point among "
            f"{', '.join(p.value for p in Point)} and n a positive integer, e.g. "
            f"{KILL_AT}={Point.MANIFEST_WRITTEN.value}:2"
        ) from exc


def reach(point: Point) -> None:
    """A save is at ``point``: run the registered hook, then the kill the environment asks
    for, if any."""
    if _hook is not None:
        _hook(point)
    spec = os.environ.get(KILL_AT)
    if spec is None:
        return
    wanted, n = _kill_at(spec)
    if wanted is point:
        _arrivals[point] = _arrivals.get(point, 0) + 1
        if _arrivals[point] == n:
            os.kill(os.getpid(), signal.SIGKILL)
