"""``load`` and ``read``: verified, all-or-nothing restore into live objects."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, MutableMapping
from typing import Any

from statekeeper.arguments import require_callable, require_mapping
from statekeeper.catalog.info import RestoreInfo
from statekeeper.catalog.location import Location, PathOrStorage, locate, resolve_storage
from statekeeper.checkpoint.adapters import Kind, Restoring, adapter_for
from statekeeper.checkpoint.checks import Strict, entry_problems
from statekeeper.checkpoint.collective import collective
from statekeeper.checkpoint.gc_pause import collector_paused
from statekeeper.checkpoint.options import RestoreOptions
from statekeeper.checkpoint.reader import PendingStep, Progress, read_step
from statekeeper.checkpoint.scope import Scope, is_distributed
from statekeeper.errors import (
    CorruptCheckpointError,
    InvalidArgumentError,
    KeyMismatchError,
    LoadStateError,
    StatekeeperWarning,
    user_stacklevel,
)
from statekeeper.format.manifest import MANIFEST
from statekeeper.state.optimizer import OptimizerChange
from statekeeper.storage.optional import fingerprint_of

__all__ = [
    "Strict",
    "check_assignable",
    "load",
    "read_statekeeper",
    "restore_entry",
    "restore_order",
]


def _is_plain(obj: Any) -> bool:
    """Whether ``obj`` is a plain value that cannot be restored in place (an int, a str, a
    tuple...): ``load`` assigns its saved value into the caller's mapping instead."""
    return adapter_for(obj).assigns_back


def check_assignable(state: Mapping[str, Any]) -> None:
    """``InvalidArgumentError`` when ``state`` holds plain values but cannot take them back
    (``InvalidArgumentTypeError`` when it is no mapping at all)."""
    require_mapping("state", state, "names to objects, e.g. {'model': model, 'opt': opt}")
    if isinstance(state, MutableMapping):
        return
    plain = sorted(name for name, obj in state.items() if _is_plain(obj))
    if plain:
        raise InvalidArgumentError(
            f"the state holds plain values ({', '.join(plain)}) that load assigns back into "
            f"the mapping, but it is a read-only {type(state).__name__}; pass a dict, or wrap "
            "each plain value in statekeeper.Value (counter = sk.Value(0); counter.value)"
        )


def restore_entry(name: str, obj: Any, value: Any, ctx: Restoring) -> None:
    """Load ``value`` (checked by the adapter's ``check``) into ``obj`` through its adapter."""
    try:
        adapter_for(obj).restore(name, obj, value, ctx)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
        raise LoadStateError(
            f"loading state entry {name!r} into its {type(obj).__name__} failed: {exc}. "
            "Entries before it were already loaded; rebuild the live objects before retrying."
        ) from exc


def restore_order(state: Mapping[str, Any]) -> list[str]:
    """The names of ``state`` in the order they are restored: RNG last, as nothing loaded
    after it may draw from the generators it restores."""
    return sorted(state, key=lambda n: adapter_for(state[n]).kind is Kind.RNG)


def load(
    path: PathOrStorage,
    state: Mapping[str, Any],
    *,
    step: int | None = None,
    strict: Strict = Strict.EXACT,
    progress: Progress | None = None,
    scope: Scope = Scope.AUTO,
    on_optimizer_change: OptimizerChange = OptimizerChange.REFUSE,
) -> RestoreInfo:
    """Load a committed step (the newest unless ``step`` is given) into the live ``state``.

    An optimizer must be of the class it was saved from (and use the same hyper-parameter
    names); ``on_optimizer_change=OptimizerChange.RESTART`` allows a deliberate switch.

    Objects are restored in place; plain values (ints, strings, tuples...) are assigned into
    ``state`` itself (and returned in ``RestoreInfo.values``), so ``state`` must be a mutable
    mapping when it holds any (or wrap them in ``statekeeper.Value``).

    Every file is read and verified, and every key, shape and dtype is checked, before the
    first ``load_state_dict`` is called: a damaged checkpoint or a mismatch leaves the live
    objects untouched. Optimizer state is matched to parameters by name; ``RNGState``
    entries are restored last.

    In a multi-process job the default ``scope=Scope.AUTO`` makes this a collective (call it
    on every rank): each rank reads only the chunks its current shards need, in any world
    size; see docs/distributed.md.

    Args:
        path: A run directory (its newest committed step, or ``step``) or a step
            directory: a path, a URL or a :class:`Storage`.
        state: The live objects, by the names they were saved under; plain values are assigned
            back into it.
        step: The step to load; ``None`` loads the newest committed one.
        strict: :class:`Strict`: whether keys the checkpoint or the state lack are an error.
        progress: ``progress(done, total)`` with the bytes read and verified.
        scope: :class:`Scope`: ``AUTO`` is a collective in a multi-process job.
        on_optimizer_change: :class:`OptimizerChange`: ``REFUSE`` an optimizer of another class,
            or ``RESTART`` it from scratch.

    Returns:
        A :class:`RestoreInfo`: the step, its path and the plain values assigned.

    Raises:
        StepNotFoundError: No such directory, no committed step, or no step ``step``.
        CorruptCheckpointError: A file is missing, truncated or fails its checksum.
        UnsupportedFormatError: The manifest's format version is not one this release reads.
        KeyMismatchError: Keys, shapes, dtypes or an optimizer's class differ from the live
            state (all differences listed); nothing was loaded.
        LoadStateError: An object's ``load_state_dict`` failed; the entries before it were
            loaded.
        InvalidArgumentError: An argument is invalid (plain values in a read-only mapping...).
    """
    options = RestoreOptions(strict, on_optimizer_change, progress)
    check_assignable(state)
    if is_distributed(scope, state):
        info = collective().load(resolve_storage(path), state, step=step, options=options)
    else:
        with collector_paused():
            info = _load_local(locate(path, step), state, options)
    if isinstance(state, MutableMapping):  # plain values go back into the caller's mapping
        state.update(info.values)
    return info


def load_located(
    location: Location,
    state: Mapping[str, Any],
    *,
    strict: Strict,
    on_optimizer_change: OptimizerChange,
) -> RestoreInfo:
    """:func:`load` of a step already located (one process): no listing of its run."""
    check_assignable(state)
    with collector_paused():
        info = _load_local(location, state, RestoreOptions(strict, on_optimizer_change, None))
    if isinstance(state, MutableMapping):
        state.update(info.values)
    return info


def _plan(prepared: dict[str, Any], ctx: Restoring) -> tuple[dict[str, Any], list[str]]:
    """Each entry's value to restore (optimizer state made positional) and every mismatch.
    Pure: it inspects the live state and loads nothing (modules whose direct copy plan
    matched are recorded in ``ctx.direct``)."""
    state = ctx.state
    problems = entry_problems(prepared, state, ctx.strict)
    adapters = {name: adapter_for(obj) for name, obj in state.items() if name in prepared}
    # optimizers last: their mismatches are listed after those of the modules they follow
    for name in sorted(adapters, key=lambda n: adapters[n].kind is Kind.OPTIMIZER):
        prepared[name], found = adapters[name].check(name, state[name], prepared[name], ctx)
        problems += found
    return prepared, problems


def _load_local(
    location: Location, state: Mapping[str, Any], options: RestoreOptions
) -> RestoreInfo:
    """Load the step once; once more where it failed its checks because another process
    saved the step again meanwhile (``overwrite=True``: the manifest and the files read may
    then be of two versions), told by its manifest's fingerprint (inode, ETag) having
    changed since before the read. A damage that is not such a race is raised as it is."""
    storage, entry = location.storage, location.entry
    seen = fingerprint_of(storage, entry, MANIFEST)
    try:
        return _load_once(location, state, options)
    except CorruptCheckpointError:
        now = fingerprint_of(storage, entry, MANIFEST)
        if seen is None or now is None or now == seen:
            raise
    return _load_once(Location(storage, entry, location.step), state, options)


def _load_once(
    location: Location, state: Mapping[str, Any], options: RestoreOptions
) -> RestoreInfo:
    ctx = Restoring(state, options.strict, options.on_optimizer_change)
    with PendingStep(location) as pending:
        try:  # checks and copy plans only inspect the state: they overlap the checksums
            prepared, problems = _plan(dict(pending.state), ctx)
        except BaseException:
            pending.verify()  # a damaged file is reported before anything else
            raise
        verified = pending.verify(options.progress)  # ... and before any mismatch
    if problems:
        raise KeyMismatchError(problems)
    for name in restore_order(state):
        if name in prepared:
            restore_entry(name, state[name], prepared[name], ctx)
    if ctx.replaced:
        warnings.warn(
            f"statekeeper: {len(ctx.replaced)} live tensor(s) overlapped themselves in memory "
            "(built with expand/meshgrid) and were given their own memory to load into: "
            + ", ".join(ctx.replaced),
            StatekeeperWarning,
            stacklevel=user_stacklevel(),
        )
    return RestoreInfo(
        verified.manifest.step, verified.location.path(), ctx.values, tuple(ctx.replaced)
    )


def read_statekeeper(
    path: PathOrStorage, *, step: int | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """The plain nested state of a statekeeper step (tensors on CPU), no live objects needed.

    ``path`` is a run directory (the newest step, or ``step``) or a step directory.
    Tensors that shared memory when saved share it again. :func:`statekeeper.read` (in
    :mod:`statekeeper.interop.reading`) also reads other formats.
    """
    require_callable("progress", progress, "progress(done, total)")
    with collector_paused():
        return read_step(locate(path, step), progress).state
