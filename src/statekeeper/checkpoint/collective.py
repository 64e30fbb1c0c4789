"""The extension point through which a multi-process job saves and loads.

The core decides *whether* a save or load is the whole job's (:mod:`.scope`); *how* it is
done belongs to a higher layer, :mod:`statekeeper.distributed`, which registers itself here
(:func:`register_collective`). The core asks :func:`collective` for it and never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from statekeeper import extensions
from statekeeper.catalog.info import CheckpointInfo, RestoreInfo
from statekeeper.checkpoint.async_save import AsyncWriter, PendingSave, Staging
from statekeeper.checkpoint.options import RestoreOptions
from statekeeper.checkpoint.request import SaveRequest
from statekeeper.errors import StatekeeperError
from statekeeper.storage.base import Storage

__all__ = ["Collective", "State", "collective", "register_collective"]

State = Mapping[str, Any]
"""A state: names to objects."""


class Collective(Protocol):
    """A save or load that every rank of the job calls together."""

    def save(self, storage: Storage, state: State, request: SaveRequest) -> CheckpointInfo:
        """Write ``state`` as ``request`` says with every rank; rank 0 commits."""
        ...

    def load(
        self, storage: Storage, state: State, *, step: int | None, options: RestoreOptions
    ) -> RestoreInfo:
        """Load a committed step into ``state`` on every rank."""
        ...

    def submit(
        self, storage: Storage, state: State, request: SaveRequest, writer: AsyncWriter
    ) -> PendingSave:
        """Stage ``state`` on every rank and write ``request``'s step in the background
        with ``writer`` (one of :meth:`async_writer`'s)."""
        ...

    def async_writer(self, staging: Staging) -> AsyncWriter:
        """A writer of background job-wide saves (its host buffers belong to its owner;
        ``staging`` says whether they are kept between saves)."""
        ...

    def decide(self, step: int, due: bool, signalled: bool, saved: bool) -> tuple[bool, bool, bool]:
        """One small collective at a step boundary: rank 0's ``due`` and ``saved`` (whether
        ``step`` is committed: clocks and listings may differ between ranks), and whether
        any rank was ``signalled`` (pre-emption). ``InvalidArgumentError`` on every rank
        when the ranks are not at the same ``step``."""
        ...

    def is_leader(self) -> bool:
        """Whether this process writes the run directory for the job (rank 0)."""
        ...


_registered: list[Collective] = []


def register_collective(handler: Collective) -> None:
    """Make ``handler`` the job-wide save and load (the last registration wins)."""
    _registered[:] = [handler]


def collective() -> Collective:
    """The registered job-wide save and load."""
    extensions.install()
    if not _registered:
        raise StatekeeperError(
            "this save or load involves the whole job, but statekeeper.distributed is not "
            "installed in this process: import statekeeper (or statekeeper.distributed) first"
        )
    return _registered[0]
