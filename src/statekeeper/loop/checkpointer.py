"""``Checkpointer``: the training loop's handle on a run directory, a thin layer over save/load.

It holds the run directory's writer lock from construction to :meth:`close`, adds every RNG
to what is saved (under the name ``"rng"``), decides when to save (a :class:`SavePolicy`)
and which steps to keep (a :class:`Retention`), and on resume removes interrupted saves and
loads the newest step that is intact.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from types import TracebackType
from typing import Any

from statekeeper.arguments import require_bool, require_step
from statekeeper.catalog.info import CheckpointInfo, RestoreInfo
from statekeeper.catalog.listing import warn_if_foreign
from statekeeper.catalog.location import PathOrStorage, resolve_storage
from statekeeper.checkpoint.async_save import AsyncWriter, PendingSave, Staging
from statekeeper.checkpoint.collective import collective
from statekeeper.checkpoint.load import Strict, check_assignable
from statekeeper.checkpoint.options import SaveOptions
from statekeeper.checkpoint.origin_level import Origin
from statekeeper.checkpoint.retention_policies import Retention
from statekeeper.checkpoint.save import check_save
from statekeeper.checkpoint.scope import Scope, is_distributed
from statekeeper.errors import InvalidArgumentError, StatekeeperError
from statekeeper.format.tensors import DEFAULT_SHARD_BYTES
from statekeeper.incremental.reuse import Incremental
from statekeeper.loop.held import Held
from statekeeper.loop.mirror.config import Mirror, MirrorStatus
from statekeeper.loop.retention import RetentionStatus
from statekeeper.loop.run_tiers import RunTiers
from statekeeper.loop.save_policies import SavePolicy, signals_of
from statekeeper.loop.saving import LoopSaves
from statekeeper.loop.signals import preempt
from statekeeper.loop.validation import check_checkpointer_options
from statekeeper.state.optimizer import OptimizerChange
from statekeeper.state.rng import Generator, RNGState

__all__ = ["RNG_ENTRY", "Checkpointer"]

RNG_ENTRY = "rng"


class Checkpointer:
    """Save and resume a training run in ``directory``.

    With an ``OnSignal(...)`` part in ``every`` (pre-emption), the signal makes the next
    ``maybe_save`` save synchronously and set ``preempted``; the loop then exits, with
    ``PREEMPTED_EXIT_CODE`` (75, ``EX_TEMPFAIL``: try again) for a scheduler that requeues.
    The previous signal handlers come back on :meth:`close`.

    With ``blocking=False``, ``save`` / ``maybe_save`` return once the tensors are copied to
    reusable host buffers and a background thread writes, commits and applies retention; a
    failure is raised by the next save, by :meth:`wait` and by :meth:`close`.

    In a multi-process job (``scope=Scope.AUTO`` with ``torch.distributed`` initialized) make
    one Checkpointer on every rank and call its methods on every rank: saves and loads are
    collective (see docs/distributed.md); rank 0 holds the lock, commits and applies
    retention. ``shard_bytes`` applies to single-process saves (each rank writes one file).

    Args:
        directory: The run directory: a path, a URL or a :class:`Storage`.
        keep: :class:`Retention` (``KeepLatest(3) | KeepBest(1, metric="loss")``...); ``None``
            keeps every step.
        every: :class:`SavePolicy` deciding when :meth:`maybe_save` saves; without one,
            ``maybe_save`` raises and only :meth:`save` saves.
        generators: Extra ``torch.Generator`` / ``numpy.random.Generator`` objects, by name.
        shard_bytes: The size at which tensor data starts a new file (single-process saves).
        blocking: ``False`` saves in the background, reusing host buffers from save to save.
        scope: :class:`Scope`: ``AUTO`` makes saves and loads collective in a job.
        incremental: :class:`Incremental`, as for :func:`save` (with ``REUSE`` no tensor file
            is shared by every step ``keep`` keeps: ``docs/incremental.md``).
        mirror: A :class:`Mirror`: a second tier every committed step is uploaded to.
        origin: :class:`Origin`, as for :func:`save`.

    Raises:
        InvalidArgumentError: An option of the wrong kind or value.
        WriterConflictError: Another live writer holds the run directory.
    """

    PREEMPTED_EXIT_CODE = 75  # os.EX_TEMPFAIL: a temporary failure, run me again

    def __init__(
        self,
        directory: PathOrStorage,
        *,
        keep: Retention | None = None,
        every: SavePolicy | None = None,
        generators: Mapping[str, Generator] | None = None,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        blocking: bool = True,
        scope: Scope = Scope.AUTO,
        incremental: Incremental = Incremental.REUSE,
        mirror: Mirror | None = None,
        origin: Origin | None = None,
    ) -> None:
        check_checkpointer_options(keep, every, mirror, blocking)
        self.storage = resolve_storage(directory)
        self._scope = scope
        self._distributed = is_distributed(scope)
        self._tiers = RunTiers(self.storage, mirror, self._distributed)
        # in a distributed job rank 0 writes the directory (and holds its lock) for everyone
        self._leader = not self._distributed or collective().is_leader()
        self.keep = keep
        self.every = every
        self.rng = RNGState(generators)
        options = SaveOptions(
            shard_bytes=shard_bytes, incremental=incremental, origin=origin, retention=keep
        )
        self._saves = LoopSaves(
            self.storage, self._tiers, options, scope=scope, leader=self._leader, keep=keep
        )
        self._last_restore: RestoreInfo | None = None
        self._closed = False
        self.preempted = False
        # the lock first, the uploader and the signal handlers under it (loop/held.py)
        self._held = Held(
            self.storage,
            leader=self._leader,
            tiers=self._tiers,
            signals=signals_of(every),
            writer=(  # owned: its host buffers are reused from one save to the next
                (collective().async_writer(Staging.REUSE) if self._distributed else AsyncWriter())
                if not blocking
                else None
            ),
        )
        self._writer, self._watch = self._held.writer, self._held.watch

    def _with_rng(self, state: Mapping[str, Any]) -> dict[str, Any]:
        if RNG_ENTRY in state:
            raise InvalidArgumentError(
                f"the state name {RNG_ENTRY!r} is reserved for the Checkpointer's RNG state; "
                "rename that entry"
            )
        return {**state, RNG_ENTRY: self.rng}

    def restore_latest(
        self,
        state: Mapping[str, Any],
        *,
        strict: Strict = Strict.EXACT,
        on_optimizer_change: OptimizerChange = OptimizerChange.REFUSE,
    ) -> int | None:
        """Load the newest intact step into ``state``; the step, or None when there is none.

        Plain values (the epoch, counters) are assigned into ``state``, as ``load`` does.

        Interrupted saves are removed first. A newest step that is damaged is skipped with a
        ``StatekeeperWarning`` (an older intact one is loaded); key mismatches are errors.
        With a mirror, the newest step intact on either tier is loaded (from the local tier
        when both hold it; downloaded from the mirror otherwise).

        Args:
            state: The live objects, by the names they were saved under.
            strict: :class:`Strict`, as for :func:`load`.
            on_optimizer_change: :class:`OptimizerChange`, as for :func:`load`.

        Returns:
            The step loaded, or ``None`` when the run has no intact step (``restore_latest(state)
            or 0`` is the step to start from).

        Raises:
            KeyMismatchError: The newest intact step does not match the live state.
            LoadStateError: An object's ``load_state_dict`` failed.
            StatekeeperError: The Checkpointer is closed.
        """
        self._check_open()
        check_assignable(state)
        self._wait_writer()
        info = self._tiers.restore(
            self._with_rng(state),
            leader=self._leader,
            strict=strict,
            scope=self._scope,
            on_optimizer_change=on_optimizer_change,
        )
        self._restored(state, info, resumed=True)
        if info is not None:
            return info.step
        warn_if_foreign(self.storage)
        return None

    def load(
        self,
        state: Mapping[str, Any],
        step: int | None = None,
        *,
        strict: Strict = Strict.EXACT,
        on_optimizer_change: OptimizerChange = OptimizerChange.REFUSE,
    ) -> RestoreInfo:
        """Load ``step`` (None: the newest committed step) into ``state``, RNG included;
        its ``RestoreInfo``, kept as :attr:`last_restore`.

        As :func:`statekeeper.load`, nothing is skipped: a damaged step raises
        ``CorruptCheckpointError`` and a missing one ``StepNotFoundError``. With a mirror
        the step is loaded from the local tier when it holds it, else from the mirror. The
        step loaded is then kept by retention, as the step :meth:`restore_latest` resumed
        from is.

        Args:
            state: The live objects, by the names they were saved under.
            step: The step to load; ``None`` loads the newest committed step.
            strict: :class:`Strict`, as for :func:`load`.
            on_optimizer_change: :class:`OptimizerChange`, as for :func:`load`.

        Returns:
            The :class:`RestoreInfo` of the step loaded (also kept as :attr:`last_restore`).

        Raises:
            StepNotFoundError: No such committed step (or none at all).
            CorruptCheckpointError: The step is damaged; nothing was loaded.
            KeyMismatchError: The step and ``state`` disagree under ``strict``.
            InvalidArgumentError: An invalid ``step`` or option.
        """
        self._check_open()
        check_assignable(state)
        if step is not None:
            require_step(step)
        self._wait_writer()
        info = self._tiers.load(
            self._with_rng(state),
            step,
            strict=strict,
            scope=self._scope,
            on_optimizer_change=on_optimizer_change,
        )
        self._restored(state, info, resumed=False)
        return info

    @property
    def last_restore(self) -> RestoreInfo | None:
        """The ``RestoreInfo`` of the last :meth:`restore_latest` or :meth:`load` (None
        before either, and after a ``restore_latest`` that found no step)."""
        return self._last_restore

    def _restored(
        self, state: Mapping[str, Any], info: RestoreInfo | None, *, resumed: bool
    ) -> None:
        self._last_restore = info
        if info is not None and isinstance(state, MutableMapping):  # as load assigns them
            state.update(info.values)
        self._saves.restored(None if info is None else info.step, resumed=resumed)

    def maybe_save(
        self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any] | None = None
    ) -> CheckpointInfo | PendingSave | None:
        """Save when the ``every`` policy says so (and ``step`` is not committed yet).

        Args:
            step: The step number of the state as it is now.
            state: The live objects and plain values to save.
            metrics: JSON-able values kept in the manifest (what :class:`KeepBest` ranks by).

        Returns:
            The committed step's :class:`CheckpointInfo` (a ``PendingSave`` with
            ``blocking=False``), or ``None`` when the policy did not save.

        Raises:
            UnsupportedValueError: A value would need pickle.
            StorageError: The storage failed; with ``blocking=False`` also the previous
                background save's error.
            StatekeeperError: The Checkpointer is closed.
        """
        check_save(step, state, metrics)
        if self.every is None:
            raise InvalidArgumentError(
                "maybe_save needs a save policy: Checkpointer(..., every=EverySteps(n))"
            )
        if self._watch is not None:
            self._watch.warn_if_replaced()
        signalled = self._watch is not None and self._watch.fired
        saved = self._saves.saved_before(step)
        due = self.every.should_save(step, self._saves.seconds_since_last()) and not saved
        if self._distributed:  # one collective: rank 0's clock and listing, any rank's signal
            due, signalled, saved = collective().decide(step, due, signalled, saved)
        if signalled:
            return self._preempt(step, state, metrics, saved)
        return self.save(step, state, metrics) if due else None

    def _preempt(
        self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any] | None, saved: bool
    ) -> CheckpointInfo | None:
        """Save ``step`` now, synchronously (``loop/signals.py``: :func:`preempt`)."""

        def now() -> CheckpointInfo | PendingSave | None:
            info = None if saved else self._save(step, state, metrics, writer=None)
            self.preempted = True
            return info

        info = preempt(self._watch, self._wait_writer, now)
        return info if isinstance(info, CheckpointInfo) or info is None else info.wait()

    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        metrics: Mapping[str, Any] | None = None,
        *,
        overwrite: bool = False,
    ) -> CheckpointInfo | PendingSave:
        """Save now (RNG included), then apply retention (in the background if async).
        ``overwrite`` replaces the step when it is committed already (a run rolled back to
        an older step saves its numbers again).

        Args:
            step: The step number of the state as it is now.
            state: The live objects and plain values to save.
            metrics: JSON-able values kept in the manifest (what :class:`KeepBest` ranks by).
            overwrite: Replace the step if it is committed already.

        Returns:
            The committed step's :class:`CheckpointInfo` (a ``PendingSave`` with
            ``blocking=False``).

        Raises:
            StepExistsError: The step is committed and ``overwrite`` is False.
            UnsupportedValueError: A value would need pickle.
            StorageError: The storage failed; with ``blocking=False`` also the previous
                background save's error.
            StatekeeperError: The Checkpointer is closed.
        """
        check_save(step, state, metrics)
        require_bool("overwrite", overwrite)
        return self._save(step, state, metrics, self._writer, overwrite)

    def _save(
        self,
        step: int,
        state: Mapping[str, Any],
        metrics: Mapping[str, Any] | None,
        writer: AsyncWriter | None,
        overwrite: bool = False,
    ) -> CheckpointInfo | PendingSave:
        self._check_open()
        return self._saves.save(
            step,
            self._with_rng(state),
            metrics,
            writer,
            overwrite=overwrite,
            wait_writer=self._wait_writer,
        )

    def wait(self) -> CheckpointInfo | None:
        """Wait for a background save, then for the uploads to the mirror; raise the save's
        error, then ``MirrorError`` for uploads that failed (no-op when there is neither).

        Returns:
            The :class:`CheckpointInfo` of the background save waited for, or ``None``.

        Raises:
            StatekeeperError: The background save's error (a :class:`StorageError`...).
            MirrorError: Uploads to the mirror failed.
        """
        info = None if self._writer is None else self._writer.wait()
        self._tiers.wait()
        return info

    def mirror_status(self) -> MirrorStatus | None:
        """Where the uploads to the mirror stand (None without a mirror).

        Returns:
            A :class:`MirrorStatus`, or ``None`` without a mirror.
        """
        return self._tiers.status()

    def _wait_writer(self) -> None:
        """Wait for a background save only (a pre-emption or a resume never waits for the
        uploads, which go on)."""
        if self._writer is not None:
            self._writer.wait()

    def retention_status(self) -> RetentionStatus:
        """The steps retention could not remove yet, with why (tried again at every save);
        empty without ``keep=`` or when every removal succeeded.

        Returns:
            A :class:`RetentionStatus`: the :class:`PendingRemoval` of each step left.
        """
        return self._saves.retention_status()

    def _check_open(self) -> None:
        if self._closed:
            raise StatekeeperError("this Checkpointer is closed; create a new one")

    def close(self) -> None:
        """Finish a background save and the uploads to the mirror, then release the writer
        lock. A failed save is raised first; failed uploads then raise ``MirrorError``, or
        are only warned about when the save failed too.

        Raises:
            StatekeeperError: The background save's error.
            MirrorError: Uploads to the mirror failed (and the save did not).
        """
        self._close(quiet_uploads=False)

    def _close(self, *, quiet_uploads: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._held.close(quiet_uploads=quiet_uploads)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close(quiet_uploads=exc_type is not None)  # the loop's own error comes first
