"""Applying a retention policy to the committed steps of one storage (one tier).

:func:`apply_retention` raises when a step cannot be removed. :class:`Retainer` is the
Checkpointer's: retention runs after a step is committed, so nothing it meets may fail that
save. A step it cannot remove (an immutable directory, a mount point: ``EBUSY``) stays, is
warned about once per reason (``StatekeeperWarning`` naming the step and why), is tried again
at every later save, and is reported by :meth:`Retainer.status` until it is gone.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from statekeeper.catalog.listing import list_checkpoints
from statekeeper.catalog.location import committed
from statekeeper.checkpoint.points import Point, reach
from statekeeper.checkpoint.retention_policies import Retention
from statekeeper.errors import StatekeeperWarning, StorageError, user_stacklevel
from statekeeper.storage.base import Storage

__all__ = ["PendingRemoval", "RetentionStatus", "Retainer", "apply_retention", "keep_only"]


@dataclass(frozen=True)
class PendingRemoval:
    """A step retention decided to delete but could not: where it is and why.

    Attributes:
        step: The step retention decided to delete.
        path: Where it is.
        reason: Why it could not be removed.
    """

    step: int
    path: str
    reason: str


@dataclass(frozen=True)
class RetentionStatus:
    """What ``Checkpointer.retention_status()`` reports: the steps retention could not remove
    yet (each tried again at the next save), and why the last pass failed as a whole (the
    run directory could not be listed, a policy raised), or None.

    Attributes:
        pending: The :class:`PendingRemoval` of each step left.
        error: Why the last retention pass failed as a whole, or ``None``.
    """

    pending: tuple[PendingRemoval, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether every step retention decided to delete is gone."""
        return not self.pending and self.error is None


def _doomed(storage: Storage, keep: Retention, protect: Iterable[int]) -> list[tuple[int, str]]:
    """``(step, entry)`` of each committed step ``keep`` does not keep; the steps in
    ``protect``, the newest step and steps whose manifest cannot be read always stay."""
    infos = list_checkpoints(storage)
    if not infos:
        return []
    readable = [i for i in infos if i.error is None]
    kept = keep.keep(readable) | {max(i.step for i in infos)} | set(protect)
    names = {p.step: p.name for p in committed(storage)}
    return [(i.step, names[i.step]) for i in readable if i.step not in kept and i.step in names]


def _remove_all(
    storage: Storage, doomed: list[tuple[int, str]]
) -> tuple[list[int], dict[int, str]]:
    deleted, failed = [], {}
    for step, entry in doomed:
        reach(Point.REMOVING)
        try:
            storage.remove(entry)
        except (StorageError, OSError) as exc:
            failed[step] = str(exc)
        else:
            deleted.append(step)
    return deleted, failed


def apply_retention(storage: Storage, keep: Retention, protect: Iterable[int] = ()) -> list[int]:
    """Delete the committed steps of ``storage`` that ``keep`` does not keep; the steps in
    ``protect`` and the newest step always stay, and so does a step whose manifest cannot be
    read (it is never deleted by a policy). Returns the steps deleted; a step that cannot be
    removed does not stop the others, and ``StorageError`` names each one at the end."""
    deleted, failed = _remove_all(storage, _doomed(storage, keep, protect))
    if failed:
        raise StorageError(
            None,
            "retention could not remove "
            + "; ".join(f"step {step}: {reason}" for step, reason in sorted(failed.items())),
        )
    return deleted


class Retainer:
    """Retention for one Checkpointer: never raises for what it meets (see the module
    docstring); safe to call from a background save's thread."""

    def __init__(self, storage: Storage, keep: Retention | None) -> None:
        self._storage = storage
        self._keep = keep
        self._mutex = threading.Lock()
        self._pending: dict[int, PendingRemoval] = {}
        self._error: str | None = None

    def apply(self, step: int, protect: Iterable[int]) -> list[int]:
        """Retention after step ``step`` was committed (kept, with those in ``protect``);
        the steps deleted (none without a policy)."""
        if self._keep is None:
            return []
        with self._mutex:
            try:
                doomed = _doomed(self._storage, self._keep, {step, *protect})
            except Exception as exc:  # listing failed, a policy's own bug: the save stands
                if str(exc) != self._error:
                    self._warn(
                        f"retention after step {step} failed ({exc}); step {step} is saved, "
                        "and retention runs again after the next save"
                    )
                self._error = str(exc)
                return []
            self._error = None
            deleted, failed = _remove_all(self._storage, doomed)
            entries = dict(doomed)
            pending = {}
            for doomed_step, reason in sorted(failed.items()):
                path = self._storage.describe(entries[doomed_step])
                known = self._pending.get(doomed_step)
                if known is None or known.reason != reason:
                    self._warn(
                        f"retention could not remove step {doomed_step} ({path}): {reason}. "
                        f"Step {step} is saved; statekeeper tries again at every save "
                        "(Checkpointer.retention_status() lists what is pending). Make the "
                        "directory removable (an immutable attribute, a mount on it) or delete "
                        "it by hand"
                    )
                pending[doomed_step] = PendingRemoval(doomed_step, path, reason)
            self._pending = pending
            return deleted

    def status(self) -> RetentionStatus:
        with self._mutex:
            pending = tuple(self._pending[s] for s in sorted(self._pending))
            return RetentionStatus(pending, self._error)

    @staticmethod
    def _warn(message: str) -> None:
        warnings.warn(f"statekeeper: {message}", StatekeeperWarning, stacklevel=user_stacklevel())


def keep_only(storage: Storage, step: int) -> list[int]:
    """After ``step`` was committed into a target saved again and again (Lightning's
    ``last.ckpt``), remove the target's other committed steps. Like :class:`Retainer`, it
    never fails the committed save: a step it cannot remove stays and is warned about (it is
    tried again at the next save of that target). Returns the steps removed."""
    doomed = [(p.step, p.name) for p in committed(storage) if p.step != step]
    deleted, failed = _remove_all(storage, doomed)
    for old, reason in sorted(failed.items()):
        Retainer._warn(
            f"could not remove step {old} of {storage.describe()} ({reason}); step {step} is "
            "saved and is the one loaded, and the old step is removed at the next save there. "
            "Make the directory removable (an immutable attribute, a mount on it) or delete it "
            "by hand"
        )
    return deleted
