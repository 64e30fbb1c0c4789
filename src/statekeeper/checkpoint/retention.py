"""Applying a retention policy to the committed steps of one storage (one tier)."""

from __future__ import annotations

from collections.abc import Iterable

from statekeeper.checkpoint.listing import list_checkpoints
from statekeeper.checkpoint.location import committed
from statekeeper.checkpoint.policies import Retention
from statekeeper.storage.base import Storage

__all__ = ["apply_retention"]


def apply_retention(storage: Storage, keep: Retention, protect: Iterable[int] = ()) -> list[int]:
    """Delete the committed steps of ``storage`` that ``keep`` does not keep; the steps in
    ``protect`` and the newest step always stay, and so does a step whose manifest cannot be
    read (it is never deleted by a policy). Returns the steps deleted."""
    infos = list_checkpoints(storage)
    if not infos:
        return []
    readable = [i for i in infos if i.error is None]
    kept = keep.keep(readable) | {max(i.step for i in infos)} | set(protect)
    names = {p.step: p.name for p in committed(storage)}
    deleted = []
    for info in readable:
        if info.step not in kept and info.step in names:
            storage.remove(names[info.step])
            deleted.append(info.step)
    return deleted
