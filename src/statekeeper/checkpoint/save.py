"""``save``: capture a state, write it pickle-free, commit it atomically.

:func:`save_state` is the one save pipeline: ``save()``, ``Checkpointer.save``, background
saves and job-wide saves all go through it. It captures each entry through its adapter
(:mod:`.adapters`, RNG first), then writes it here, or hands it to an :class:`AsyncWriter`,
or hands the whole state to the registered :mod:`.collective` save when the whole job takes
part.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any, Literal, TypedDict, Unpack, overload

from statekeeper.arguments import require_bool, require_mapping
from statekeeper.catalog.info import CheckpointInfo
from statekeeper.catalog.location import PathOrStorage, resolve_storage, validate_step
from statekeeper.catalog.paths import writer_lock
from statekeeper.checkpoint.adapters import Adapter, Capturing, Kind, adapter_for
from statekeeper.checkpoint.async_save import AsyncWriter, PendingSave, Staging
from statekeeper.checkpoint.collective import collective
from statekeeper.checkpoint.gc_pause import collector_paused
from statekeeper.checkpoint.options import SaveOptions
from statekeeper.checkpoint.origin_level import Origin
from statekeeper.checkpoint.request import SaveRequest
from statekeeper.checkpoint.scope import Scope, is_distributed
from statekeeper.checkpoint.writer import METRICS, Prepared, commit, prepare
from statekeeper.errors import InvalidArgumentError
from statekeeper.format.tensors import DEFAULT_SHARD_BYTES
from statekeeper.incremental.marks import frozen_marks, steady_names
from statekeeper.incremental.reuse import Incremental, IncrementalCache
from statekeeper.progress import Progress
from statekeeper.state.modules import unwrap
from statekeeper.state.rng import RNGState
from statekeeper.storage.base import Storage

__all__ = ["capture", "check_save", "check_state", "frozen_names", "save", "save_state"]


def check_state(state: object, argument: str = "state") -> None:
    """``InvalidArgumentTypeError`` unless ``state`` is a mapping of names to objects."""
    require_mapping(argument, state, "names to objects, e.g. {'model': model, 'opt': opt}")


def check_save(step: object, state: object, metrics: object) -> None:
    """The checks of a save's arguments, made once by each public entry point
    (:func:`save_state` takes them as checked)."""
    validate_step(step)
    check_state(state)
    require_mapping("metrics", metrics, METRICS, optional=True)


def _check_names(state: Mapping[str, Any]) -> None:
    for name in state:
        if not isinstance(name, str) or not name or name.startswith("$") or "/" in name:
            raise InvalidArgumentError(
                f"state name {name!r} is not allowed: "
                "use a non-empty str without '/' or a leading '$'"
            )


Adapters = dict[str, Adapter]


def capture(state: Mapping[str, Any], adapters: Adapters | None = None) -> dict[str, Any]:
    """Each entry's plain state, through its adapter (a Stateful object's ``state_dict()``,
    an optimizer's keyed by parameter name, a plain value itself); ``adapters`` are the
    entries' adapters when the caller looked them up already."""
    _check_names(state)
    if adapters is None:
        adapters = {name: adapter_for(obj) for name, obj in state.items()}
    owned = {id(g) for name, obj in state.items() for g in adapters[name].generators(obj)}
    for obj in state.values():
        if isinstance(obj, RNGState) and any(id(g) in owned for g in obj.generators.values()):
            raise InvalidArgumentError(
                "a generator registered with the RNG state is also a data loader's generator; "
                "statekeeper saves it with the loader (in the right order): unregister it"
            )
    ctx = Capturing(state)
    captured: dict[str, Any] = {}
    # RNG first: a state_dict() that draws random numbers must not change what is saved
    for name in sorted(state, key=lambda n: adapters[n].kind is not Kind.RNG):
        captured[name] = adapters[name].capture(name, state[name], ctx)
    return {name: captured[name] for name in state}


def frozen_names(state: Mapping[str, Any], adapters: Adapters | None = None) -> frozenset[str]:
    """Tensor names of parameters that do not require grad (stored in shards of their own)."""
    names: set[str] = set()
    for name, obj in state.items():
        adapter = adapters[name] if adapters is not None else adapter_for(obj)
        if adapter.kind is Kind.MODULE:
            params = unwrap(obj).named_parameters()
            names.update(f"{name}/{p}" for p, param in params if not param.requires_grad)
    return frozenset(names)


def save_state(
    storage: Storage,
    state: Mapping[str, Any],
    request: SaveRequest,
    *,
    scope: Scope,
    writer: AsyncWriter | None = None,
    lock: AbstractContextManager[None] | None = None,
) -> CheckpointInfo | PendingSave:
    """The one save pipeline.

    1. a job-wide save (:func:`~.scope.is_distributed`) goes to the registered collective
       save, on every rank; ``request.on_commit`` runs on every rank;
    2. else each entry is captured (RNG first) and, with a ``writer``, staged and written
       in the background (``lock`` is held until the background write ends), or written
       and committed now (under ``lock``).

    ``request.on_commit(info)`` runs once the step is committed (retention). The caller
    checked the state (:func:`check_save`); ``request`` checked itself.
    """
    if is_distributed(scope, state):  # every rank; rank 0 takes the lock itself
        if writer is not None:
            return collective().submit(storage, state, request, writer)
        info = collective().save(storage, state, request)
    else:
        step, metrics, options = request.step, request.metrics, request.options
        # looked up once per entry (a state may have 500,000 top-level tensors)
        adapters = {name: adapter_for(obj) for name, obj in state.items()}
        options = replace(options, frozen=frozen_names(state, adapters))
        if writer is not None:
            prepared = writer.prepare(capture(state, adapters), metrics)  # less stall
            options = _grouped(storage, prepared, options)
            return writer.submit(
                storage,
                prepared,
                step=step,
                options=options,
                lock=lock,
                on_commit=request.on_commit,
            )
        with lock or nullcontext(), collector_paused():
            prepared = prepare(capture(state, adapters), metrics)
            options = _grouped(storage, prepared, options)
            info = commit(storage, prepared, step=step, options=options)
    if request.on_commit is not None:
        request.on_commit(info)
    return info


def _grouped(storage: Storage, prepared: Prepared, options: SaveOptions) -> SaveOptions:
    """``options`` with what an incremental save remembers, taken from the tensors it will
    write (live ones, before any staging): the tensors unchanged since the last save
    (``steady``), and the marks of the frozen ones."""
    if options.incremental is Incremental.WRITE_ALL:
        return options
    stored = prepared.stored
    trusted = options.incremental is Incremental.TRUST_MARKS  # marks skip hashing only then
    return replace(
        options,
        steady=steady_names(storage, stored, options.cache.seen),
        marks=frozen_marks(stored, options.frozen) if trusted else {},
    )


ONE_OFF_CACHE = IncrementalCache()
"""What :func:`save` remembers between its calls for incremental saves (per run directory:
the tensors seen unchanged, the files checked, the frozen shards' marks): ``save`` is a
function and keeps no object of its own, so its calls share this one (a ``Checkpointer``
owns its own). Memory only, never a verdict: a file is reused only when its checksum
matches. Empty again in a forked child."""


def _one_off_writer(distributed: bool) -> AsyncWriter:
    """A writer of one background save, owned by the ``PendingSave`` it returns: nothing in
    the process remembers it. A second save into the run directory while the first is
    written is refused (``WriterConflictError``) by the directory's writer lock, which the
    first holds until it is committed; the caller waits for the first before saving again."""
    return (
        collective().async_writer(Staging.RELEASE) if distributed else AsyncWriter(Staging.RELEASE)
    )


class _Keywords(TypedDict, total=False):
    """The keywords of :func:`save` that do not decide what it returns (for its overloads)."""

    metrics: Mapping[str, Any] | None
    overwrite: bool
    shard_bytes: int
    scope: Scope
    incremental: Incremental
    origin: Origin | None


@overload
def save(
    directory: PathOrStorage,
    state: Mapping[str, Any],
    *,
    step: int,
    blocking: Literal[True] = ...,
    progress: Progress | None = ...,
    **keywords: Unpack[_Keywords],
) -> CheckpointInfo: ...


@overload
def save(
    directory: PathOrStorage,
    state: Mapping[str, Any],
    *,
    step: int,
    blocking: Literal[False],
    **keywords: Unpack[_Keywords],
) -> PendingSave: ...


def save(
    directory: PathOrStorage,
    state: Mapping[str, Any],
    *,
    step: int,
    metrics: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    blocking: bool = True,
    scope: Scope = Scope.AUTO,
    progress: Progress | None = None,
    incremental: Incremental = Incremental.REUSE,
    origin: Origin | None = None,
) -> CheckpointInfo | PendingSave:
    """Save ``state`` as committed step ``step`` of the run ``directory``.

    ``state`` maps names to Stateful objects (anything with ``state_dict``/``load_state_dict``)
    or plain values. The step becomes visible only once all its bytes are durable.

    With ``blocking=False`` the call returns once the tensors are copied to host memory and
    a background thread writes and commits: a :class:`PendingSave`, owned by the caller
    alone, whose ``wait()`` (or the end of a ``with`` block) returns the CheckpointInfo or
    raises the save's error; dropped unwaited it gives a ``StatekeeperWarning`` naming the
    step. Another save into the same directory before it is written raises
    ``WriterConflictError``, before anything is copied (wait for it first; through one
    ``FsspecStorage`` object too, but an object store's lock excludes no other process or
    object). Up to four one-off background saves into different directories are written at
    once; more wait their turn. The host copy is freed once the step is written; to save the same
    state again and again, ``Checkpointer(..., blocking=False)`` keeps and reuses it. In a
    job, every rank stages its own state and writes in the background (docs/distributed.md,
    "Background saves in a job").

    In a multi-process job (``torch.distributed`` initialized, more than one rank) the
    default ``scope=Scope.AUTO`` makes this a collective: call it on every rank. Sharded
    (FSDP2/DTensor) and replicated (DDP) state is written once through
    ``torch.distributed.checkpoint``, each rank's RNG and loader state is kept per rank, and
    rank 0 commits once all ranks have written (see docs/distributed.md). Pass
    ``scope=Scope.LOCAL`` to save from one process alone.

    ``progress(done, total)`` (blocking single-process saves) is called with the tensor bytes
    written so far.

    ``incremental=Incremental.REUSE`` (the default, single-process saves): a tensor file
    identical to a file of an earlier committed step is hard-linked (or copied by the
    object store) instead of written; ``CheckpointInfo.written`` says what was written.

    ``origin`` (an :class:`Origin`) is how much the manifest records about where the step was
    written (host, command line, git commit); ``None`` takes the ``STATEKEEPER_ORIGIN``
    environment variable, else ``Origin.REDACTED`` (secret-looking arguments redacted).

    Args:
        directory: The run directory: a path, a URL or a :class:`Storage`.
        state: Names to Stateful objects (modules, optimizers, schedulers, loaders) or plain
            values.
        step: The step number, an int >= 0; the step directory is ``step_<step:09d>``.
        metrics: JSON-able values kept in the manifest (what :class:`KeepBest` ranks by).
        overwrite: Replace the step if it is committed already.
        shard_bytes: The size at which tensor data starts a new file.
        blocking: ``False`` returns once the tensors are copied to host memory, the write and
            the commit running in the background.
        scope: :class:`Scope`: ``AUTO`` is a collective in a multi-process job.
        progress: ``progress(done, total)`` with the tensor bytes written (blocking
            single-process saves only).
        incremental: :class:`Incremental`: whether unchanged tensor files are linked.
        origin: :class:`Origin`: what the manifest records about where the step was written.

    Returns:
        The committed step's :class:`CheckpointInfo`; with ``blocking=False``, a
        ``PendingSave`` whose ``wait()`` returns it.

    Raises:
        StepExistsError: The step is committed already and ``overwrite`` is False.
        WriterConflictError: Another live writer holds the run directory.
        UnsupportedValueError: A value would need pickle (the message names its key path).
        InvalidArgumentError: An argument is invalid (a negative step, metrics that are not
            JSON, ``progress`` with ``blocking=False``...).
        StorageError: The storage failed to write or commit the step.
    """
    storage = resolve_storage(directory)
    check_save(step, state, metrics)
    require_bool("blocking", blocking)
    if progress is not None and not blocking:
        raise InvalidArgumentError("progress= is only for blocking single-process saves")
    options = SaveOptions(
        overwrite=overwrite,
        shard_bytes=shard_bytes,
        progress=progress,
        incremental=incremental,
        origin=origin,
        cache=ONE_OFF_CACHE,
    )
    distributed = is_distributed(scope, state)
    return save_state(
        storage,
        state,
        SaveRequest(step, metrics, options),
        scope=scope,
        writer=None if blocking else _one_off_writer(distributed),
        # one save alone, even through a Storage object already writing; a job's: rank 0's
        lock=None if distributed else writer_lock(storage, exclusive=True),
    )
