"""What a save is asked to do, as one frozen, validated object that every save path takes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from statekeeper.arguments import require_bool, require_callable
from statekeeper.checkpoint.checks import Strict
from statekeeper.checkpoint.origin import library_versions, origin
from statekeeper.checkpoint.origin_level import Origin, origin_level
from statekeeper.checkpoint.retention_policies import Retention
from statekeeper.errors import InvalidArgumentError, InvalidArgumentTypeError
from statekeeper.format.tensors import DEFAULT_SHARD_BYTES
from statekeeper.incremental.marks import Mark
from statekeeper.incremental.reuse import Incremental, IncrementalCache
from statekeeper.progress import Progress
from statekeeper.state.optimizer import OptimizerChange

__all__ = ["Provenance", "RestoreOptions", "SaveOptions"]


@dataclass(frozen=True)
class Provenance:
    """Who wrote a step, when and where: the manifest's ``created``, ``library`` and
    ``origin`` members (``origin`` empty: not written, as in the golden files)."""

    created: str
    library: dict[str, str]
    origin: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def now(cls, level: Origin = Origin.REDACTED) -> Provenance:
        """This moment (UTC, microseconds), these versions, this host and command (as much
        as ``level`` records)."""
        return cls(
            datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            library_versions(),
            origin(level),
        )


@dataclass(frozen=True)
class SaveOptions:
    """How one step is written.

    - ``overwrite``: replace the step if it is committed already (else ``StepExistsError``);
    - ``shard_bytes``: the size tensor files are split at (single-process saves);
    - ``frozen``: tensor names of parameters that do not require grad, stored in shards of
      their own (an incremental save can then skip them);
    - ``progress(done, total)``: called with the tensor bytes written so far;
    - ``provenance``: the manifest's creation time and library versions; ``None`` takes
      :meth:`Provenance.now` when the manifest is written (golden-file tests pin it);
    - ``incremental``: whether shards identical to files of the previous step are reused
      (:class:`~statekeeper.incremental.reuse.Incremental`);
    - ``marks``: the frozen parameters' version marks, taken in the caller (an incremental
      save skips checksumming a frozen shard whose tensors did not move);
    - ``steady``: tensor names found unchanged since the previous save, stored in shards of
      their own after the frozen ones (an incremental save can then reuse them whole);
    - ``origin``: how much the manifest's ``origin`` records
      (:class:`~statekeeper.checkpoint.origin_level.Origin`); ``None``: ``STATEKEEPER_ORIGIN``,
      else ``Origin.REDACTED``, read when the manifest is written.
    - ``retention``: the policy applied after the save (None: every step stays); an
      incremental save links only where a step that stays keeps an independent copy.
    - ``cache``: what incremental saves remember between saves
      (:class:`~statekeeper.incremental.reuse.IncrementalCache`), owned by the maker of
      these options: a ``Checkpointer`` keeps one for its saves (``replace`` keeps it); a
      new ``SaveOptions`` gets a new, empty one.
    """

    overwrite: bool = False
    shard_bytes: int = DEFAULT_SHARD_BYTES
    frozen: frozenset[str] = frozenset()
    progress: Progress | None = None
    provenance: Provenance | None = None
    incremental: Incremental = Incremental.REUSE
    marks: Mapping[str, Mark | None] = field(default_factory=dict)
    steady: frozenset[str] = frozenset()
    origin: Origin | None = None
    retention: Retention | None = None
    cache: IncrementalCache = field(default_factory=IncrementalCache, compare=False, repr=False)

    def __post_init__(self) -> None:
        origin_level(self.origin)  # a wrong argument, or a wrong STATEKEEPER_ORIGIN, now
        if not isinstance(self.incremental, Incremental):
            raise InvalidArgumentTypeError(
                f"incremental must be a statekeeper.Incremental, got {self.incremental!r}"
            )
        require_bool("overwrite", self.overwrite)
        if not isinstance(self.shard_bytes, int) or isinstance(self.shard_bytes, bool):
            raise InvalidArgumentTypeError(
                f"shard_bytes must be a positive int number of bytes, got "
                f"{type(self.shard_bytes).__name__} {self.shard_bytes!r}; pass e.g. 1 << 30"
            )
        if self.shard_bytes < 1:
            raise InvalidArgumentError(
                f"shard_bytes must be a positive number of bytes, got {self.shard_bytes!r}"
            )
        require_callable("progress", self.progress, "progress(done, total)")

    def provenance_now(self) -> Provenance:
        """The provenance to record: the pinned one, or this moment's."""
        return self.provenance or Provenance.now(origin_level(self.origin))


@dataclass(frozen=True)
class RestoreOptions:
    """How a step is loaded: which key mismatches are tolerated (``strict``), what an
    optimizer of another class means (``on_optimizer_change``), and ``progress(done,
    total)`` of the verified bytes."""

    strict: Strict = Strict.EXACT
    on_optimizer_change: OptimizerChange = OptimizerChange.REFUSE
    progress: Progress | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.strict, Strict):
            raise InvalidArgumentTypeError(
                f"strict must be a statekeeper.Strict, got {self.strict!r}"
            )
        if not isinstance(self.on_optimizer_change, OptimizerChange):
            raise InvalidArgumentTypeError(
                "on_optimizer_change must be a statekeeper.training.OptimizerChange, got "
                f"{self.on_optimizer_change!r}"
            )
        require_callable("progress", self.progress, "progress(done, total)")
