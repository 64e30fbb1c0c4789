"""One save, as the layers below the public entry points pass it: :class:`SaveRequest`.

``statekeeper.save(...)`` and ``Checkpointer.save(...)`` take keywords; below them every
layer (the pipeline, the background writers, the job-wide save registered by
:mod:`statekeeper.distributed`) takes one ``SaveRequest``: the step, its metrics and how it
is written (:class:`~statekeeper.checkpoint.options.SaveOptions`), checked once, when it
is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from statekeeper.arguments import require_callable, require_instance, require_mapping
from statekeeper.catalog.info import CheckpointInfo
from statekeeper.catalog.location import validate_step
from statekeeper.checkpoint.options import SaveOptions
from statekeeper.checkpoint.writer import METRICS

__all__ = ["OnCommit", "SaveRequest"]

OnCommit = Callable[[CheckpointInfo], None]
"""Work run once a step is committed (retention)."""


@dataclass(frozen=True)
class SaveRequest:
    """Save a state as committed step ``step`` with ``metrics`` (JSON values, or None),
    written as ``options`` say; ``on_commit(info)`` runs once the step is committed (a
    ``Checkpointer``'s retention; in a job, on every rank)."""

    step: int
    metrics: Mapping[str, Any] | None = None
    options: SaveOptions = field(default_factory=SaveOptions)
    on_commit: OnCommit | None = None

    def __post_init__(self) -> None:
        validate_step(self.step)
        require_mapping("metrics", self.metrics, METRICS, optional=True)
        require_instance("options", self.options, SaveOptions, "a SaveOptions")
        require_callable("on_commit", self.on_commit, "on_commit(info)")

    def with_options(self, **changes: Any) -> SaveRequest:
        """This request with ``options`` changed as ``replace(options, **changes)``."""
        return replace(self, options=replace(self.options, **changes))
