"""Restarting over damage: a run resumed from an older step may save again the numbers of
the damaged steps it skipped.

``restore_latest`` loads the newest step that loads intact; every committed step of the
local tier newer than that one failed to load (:func:`damaged_since`). Refusing to save those
numbers would leave the restarted run without a good checkpoint until it passes them, so the
Checkpointer saves them again, after :func:`set_aside` renamed the damaged copy to
``step_N.damaged-<id>`` (kept as evidence, never read, never deleted by statekeeper; listed by
``statekeeper ls``). A storage that cannot rename (object stores) replaces it, with a warning.
"""

from __future__ import annotations

import warnings

from statekeeper.catalog.location import committed
from statekeeper.errors import StatekeeperWarning, user_stacklevel
from statekeeper.storage.base import Storage

__all__ = ["DAMAGED_LABEL", "DamagedSteps", "damaged_since", "set_aside"]

DAMAGED_LABEL = "damaged"


def damaged_since(storage: Storage, resumed: int | None) -> set[int]:
    """The committed steps newer than ``resumed`` (all when None): those a resume skipped."""
    return {p.step for p in committed(storage) if resumed is None or p.step > resumed}


def set_aside(storage: Storage, step: int) -> bool:
    """Take the damaged committed step ``step`` out of the way of a new save of that step
    (the caller holds the writer lock); whether the save must replace it instead (the
    storage cannot set entries aside)."""
    entry = next((p.name for p in committed(storage) if p.step == step), None)
    if entry is None:
        return False  # gone already (removed by hand)
    method = getattr(storage, "set_aside", None)
    if not callable(method):
        warnings.warn(
            f"statekeeper: step {step} of {storage.describe()} was damaged (the resume skipped "
            "it); this storage cannot keep it aside, so the new save of that step replaces "
            "it. Copy it elsewhere before the restarted run reaches that step to keep it",
            StatekeeperWarning,
            stacklevel=user_stacklevel(),
        )
        return True
    aside = method(entry, DAMAGED_LABEL)
    warnings.warn(
        f"statekeeper: step {step} of {storage.describe()} was damaged (the resume skipped "
        f"it); it is set aside as {storage.describe(aside)} (kept as evidence, never read) "
        "and the restarted run saves the step again. Inspect it with `statekeeper verify`, "
        "then delete it",
        StatekeeperWarning,
        stacklevel=user_stacklevel(),
    )
    return False


class DamagedSteps:
    """The Checkpointer's record of the steps its resume skipped as damaged (kept by the
    process that holds the writer lock): each is saved again, its damaged copy set aside
    first."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._steps: set[int] = set()

    def found(self, resumed: int | None) -> None:
        """After a resume from ``resumed`` (None: from nothing)."""
        self._steps = damaged_since(self._storage, resumed)

    def __contains__(self, step: object) -> bool:
        return step in self._steps

    def saved(self, step: int) -> bool:
        """Whether ``step`` is committed and not one to save again over damage."""
        return step not in self._steps and any(p.step == step for p in committed(self._storage))

    def set_aside(self, step: int) -> bool:
        """Before the new save of the damaged ``step``: its copy set aside; whether the save
        must replace it instead (see :func:`set_aside`)."""
        self._steps.discard(step)
        return set_aside(self._storage, step)
