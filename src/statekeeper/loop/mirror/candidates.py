"""The steps a run may hold, from one listing of its top level: what a resume decides
"newest" from, at a cost that does not grow with what the steps hold.

A storage whose ``entries()`` must list every object of the run to tell a committed entry
from an interrupted one (an object store: the commit marker is one object among the
step's files) may also have ``top_level()`` (the entries' names from one listing of the
run's top level) and ``is_committed(entry)`` (one request): :class:`FsspecStorage` has
both. Such a run is listed with ``top_level()``, and each step's commit marker is asked
for only when that step is tried (:func:`committed_name`): deciding what is newest costs
one listing of the top level (a page per 1,000 names; prefixes that are no step cost
their share of it, never a request of their own) plus one request for the newest step,
whatever the steps hold. Every other storage is listed with ``entries()``, as
:func:`~statekeeper.catalog.location.committed` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from statekeeper.catalog.location import committed
from statekeeper.catalog.naming import EntryKind, parse_entry
from statekeeper.storage.base import Storage

__all__ = ["Candidate", "candidates", "committed_name"]


@dataclass(frozen=True)
class Candidate:
    """A step the run may hold: the names that may hold its committed copy, in the order
    they are tried (``step_N``, then the copies an interrupted overwrite set aside);
    ``known``: the first is committed (the listing said so)."""

    step: int
    names: tuple[str, ...]
    known: bool


def candidates(storage: Storage) -> list[Candidate]:
    """The steps ``storage`` may hold, ascending (see the module docstring)."""
    top = getattr(storage, "top_level", None)
    names = top() if callable(top) else None
    if names is None:
        return [Candidate(p.step, (p.name,), True) for p in committed(storage)]
    found: dict[int, list[str]] = {}
    for parsed in sorted(filter(None, map(parse_entry, names)), key=lambda p: p.name):
        if parsed.kind is EntryKind.COMMITTED:
            found.setdefault(parsed.step, []).insert(0, parsed.name)
        elif parsed.kind is EntryKind.REPLACED:
            found.setdefault(parsed.step, []).append(parsed.name)
    return [Candidate(step, tuple(found[step]), False) for step in sorted(found)]


def committed_name(storage: Storage, candidate: Candidate) -> str | None:
    """The name of ``candidate``'s committed copy; None when none of its names is committed
    (a save or an upload in progress, or cut)."""
    if candidate.known:
        return candidate.names[0]
    check = getattr(storage, "is_committed", None)
    for name in candidate.names:
        if not callable(check) or check(name):
            return name
    return None
