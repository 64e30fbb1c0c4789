"""``load`` and ``read``: verified, all-or-nothing restore into live objects."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from statekeeper.checkpoint.checks import Strict, check_state
from statekeeper.checkpoint.direct import Pair, copy_pairs, direct_pairs
from statekeeper.checkpoint.gc_pause import collector_paused
from statekeeper.checkpoint.info import RestoreInfo
from statekeeper.checkpoint.location import Location, PathOrStorage, locate, resolve_storage
from statekeeper.checkpoint.reader import PendingStep, Progress, read_step
from statekeeper.data.torchdata import is_stateful_dataloader, restore_loader
from statekeeper.distributed.scope import Scope, is_distributed
from statekeeper.errors import (
    InvalidArgumentError,
    KeyMismatchError,
    LoadStateError,
    StatekeeperWarning,
)
from statekeeper.state.modules import unwrap
from statekeeper.state.optimizer import OptimizerChange, parameter_names, to_positional
from statekeeper.state.rng import RNGState
from statekeeper.stateful import is_stateful

__all__ = ["StatekeeperWarning", "Strict", "load", "read_statekeeper"]


def _replace_overlapping(name: str, module: torch.nn.Module, keys: set[str]) -> list[str]:
    """Give self-overlapping live tensors their own memory so they can be loaded into."""
    replaced = []
    tensors = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    for key, t in tensors:
        if key in keys and t is not None and torch._debug_has_internal_overlap(t) == 1:
            with torch.no_grad():
                t.data = t.detach().clone(memory_format=torch.contiguous_format)
            replaced.append(f"{name}/{key}")
    return replaced


def _is_plain(obj: Any) -> bool:
    """Whether ``obj`` is a plain value that cannot be restored in place (an int, a str, a
    tuple...): ``load`` assigns its saved value into the caller's mapping instead."""
    return not (
        isinstance(obj, torch.nn.Module | torch.Tensor | MutableMapping | list | RNGState)
        or is_stateful_dataloader(obj)
        or is_stateful(obj)
    )


def check_assignable(state: Mapping[str, Any]) -> None:
    """``InvalidArgumentError`` when ``state`` holds plain values but cannot take them back."""
    if isinstance(state, MutableMapping):
        return
    plain = sorted(name for name, obj in state.items() if _is_plain(obj))
    if plain:
        raise InvalidArgumentError(
            f"the state holds plain values ({', '.join(plain)}) that load assigns back into "
            f"the mapping, but it is a read-only {type(state).__name__}; pass a dict, or wrap "
            "each plain value in statekeeper.Value (counter = sk.Value(0); counter.value)"
        )


def _apply(
    name: str,
    obj: Any,
    value: Any,
    strict: Strict,
    values: dict[str, Any],
    direct: bool = False,
) -> list[str]:
    """Load ``value`` into ``obj``; with ``direct``, a module whose ``direct_pairs`` plan
    still holds gets its tensors copied instead of a ``load_state_dict`` call."""
    replaced: list[str] = []
    pairs: list[Pair] | None = None
    try:
        if isinstance(obj, torch.nn.Module):
            inner = unwrap(obj)
            replaced = _replace_overlapping(name, inner, set(value))
            if direct:  # planned before the checksums: the plan again, with today's tensors
                pairs = direct_pairs(inner, value)  # (an earlier entry may have replaced some)
            if pairs is None:
                inner.load_state_dict(value, strict=strict is Strict.EXACT)
            else:
                copy_pairs(pairs)
        elif is_stateful_dataloader(obj):
            restore_loader(obj, value)
        elif is_stateful(obj):
            obj.load_state_dict(value)
        elif isinstance(obj, torch.Tensor):
            with torch.no_grad():
                obj.copy_(value)
        elif isinstance(obj, MutableMapping) and isinstance(value, Mapping):
            obj.clear()
            obj.update(value)
        elif isinstance(obj, list) and isinstance(value, list):
            obj[:] = value
        else:
            values[name] = value
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
        raise LoadStateError(
            f"loading state entry {name!r} into its {type(obj).__name__} failed: {exc}. "
            "Entries before it were already loaded; rebuild the live objects before retrying."
        ) from exc
    return replaced


def load(
    directory: PathOrStorage,
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
    """
    if not isinstance(strict, Strict):
        raise InvalidArgumentError(f"strict must be a statekeeper.Strict, got {strict!r}")
    if not isinstance(on_optimizer_change, OptimizerChange):
        raise InvalidArgumentError(
            "on_optimizer_change must be a statekeeper.OptimizerChange, got "
            f"{on_optimizer_change!r}"
        )
    if not isinstance(state, Mapping):
        raise InvalidArgumentError(
            f"state must be a mapping of names to objects, got {type(state).__name__}"
        )
    check_assignable(state)
    if is_distributed(scope, state):
        from statekeeper.distributed.load import load_distributed

        info = load_distributed(resolve_storage(directory), state, step=step, strict=strict)
    else:
        with collector_paused():
            info = _load_local(
                locate(directory, step), state, strict, progress, on_optimizer_change
            )
    if isinstance(state, MutableMapping):  # plain values go back into the caller's mapping
        state.update(info.values)
    return info


def _plan(
    prepared: dict[str, Any], state: Mapping[str, Any], strict: Strict, change: OptimizerChange
) -> tuple[dict[str, Any], set[str], list[str]]:
    """The state to load (optimizer state made positional), the modules that have a direct
    copy plan (whose keys, shapes and dtypes it already matched), and every mismatch."""
    planned = {
        name
        for name, obj in state.items()
        if isinstance(obj, torch.nn.Module)
        and isinstance(prepared.get(name), Mapping)
        and direct_pairs(unwrap(obj), prepared[name]) is not None
    }
    problems = check_state(prepared, state, strict, planned=planned)
    with_optimizer = any(isinstance(obj, torch.optim.Optimizer) for obj in state.values())
    names = parameter_names(state) if with_optimizer else {}
    for name, obj in state.items():
        if name in prepared and isinstance(obj, torch.optim.Optimizer):
            prepared[name], mismatches = to_positional(name, prepared[name], obj, names, change)
            problems += mismatches
    return prepared, planned, problems


def _load_local(
    location: Location,
    state: Mapping[str, Any],
    strict: Strict,
    progress: Progress | None,
    change: OptimizerChange,
) -> RestoreInfo:
    with PendingStep(location) as pending:
        try:  # checks and copy plans only inspect the state: they overlap the checksums
            prepared, planned, problems = _plan(dict(pending.state), state, strict, change)
        except BaseException:
            pending.verify()  # a damaged file is reported before anything else
            raise
        verified = pending.verify(progress)  # ... and before any mismatch
    if problems:
        raise KeyMismatchError(problems)
    values: dict[str, Any] = {}
    replaced: list[str] = []
    # RNG last: nothing loaded after it may draw from the generators it restores
    for name in sorted(state, key=lambda n: isinstance(state[n], RNGState)):
        if name in prepared:
            replaced += _apply(name, state[name], prepared[name], strict, values, name in planned)
    if replaced:
        warnings.warn(
            f"statekeeper: {len(replaced)} live tensor(s) overlapped themselves in memory (built "
            "with expand/meshgrid) and were given their own memory to load into: "
            + ", ".join(replaced),
            StatekeeperWarning,
            stacklevel=3,  # the caller of load()
        )
    return RestoreInfo(verified.manifest.step, verified.location.path(), values, tuple(replaced))


def read_statekeeper(
    directory: PathOrStorage, *, step: int | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """The plain nested state of a statekeeper step (tensors on CPU), no live objects needed.

    ``directory`` is a run directory (the newest step, or ``step``) or a step directory.
    Tensors that shared memory when saved share it again. :func:`statekeeper.read` (in
    :mod:`statekeeper.interop.reading`) also reads other formats.
    """
    with collector_paused():
        return read_step(locate(directory, step), progress).state
