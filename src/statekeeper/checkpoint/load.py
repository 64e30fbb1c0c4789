"""``load`` and ``read``: verified, all-or-nothing restore into live objects."""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping, MutableMapping
from enum import StrEnum
from typing import Any

import torch

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
from statekeeper.interop.detect import foreign_format
from statekeeper.interop.reading import read_foreign
from statekeeper.state.modules import unwrap
from statekeeper.state.optimizer import OptimizerChange, parameter_names, to_positional
from statekeeper.state.rng import RNGState
from statekeeper.stateful import is_stateful

__all__ = ["StatekeeperWarning", "Strict", "load", "read"]


class Strict(StrEnum):
    """Which key mismatches ``load`` tolerates. Shape and dtype mismatches are always errors.

    - ``EXACT``: every key of the live state and of the checkpoint must match (default).
    - ``ALLOW_MISSING``: live keys absent from the checkpoint keep their current values.
    - ``ALLOW_UNEXPECTED``: checkpoint keys with no live counterpart are ignored.
    - ``PARTIAL``: both of the above.
    """

    EXACT = "exact"
    ALLOW_MISSING = "allow_missing"
    ALLOW_UNEXPECTED = "allow_unexpected"
    PARTIAL = "partial"

    @property
    def missing_ok(self) -> bool:
        return self in (Strict.ALLOW_MISSING, Strict.PARTIAL)

    @property
    def unexpected_ok(self) -> bool:
        return self in (Strict.ALLOW_UNEXPECTED, Strict.PARTIAL)


def _check_tensor(where: str, saved: Any, live: Any, problems: list[str]) -> None:
    if isinstance(live, torch.Tensor) and isinstance(saved, torch.Tensor):
        if saved.shape != live.shape:
            problems.append(
                f"{where}: shape {tuple(saved.shape)} in checkpoint, {tuple(live.shape)} live"
            )
        elif saved.dtype != live.dtype:
            problems.append(f"{where}: dtype {saved.dtype} in checkpoint, {live.dtype} live")
    elif isinstance(live, torch.Tensor) != isinstance(saved, torch.Tensor):
        problems.append(
            f"{where}: {type(saved).__name__} in checkpoint, {type(live).__name__} live"
        )


def _check(
    saved: dict[str, Any],
    state: Mapping[str, Any],
    strict: Strict,
    planned: Collection[str] = (),
) -> list[str]:
    """Every key, shape and dtype mismatch; modules in ``planned`` (whose direct copy plan
    already matched every key, shape and dtype) are not compared again."""
    problems: list[str] = []
    if not strict.missing_ok:
        problems += [f"{n}: missing from the checkpoint" for n in state if n not in saved]
    if not strict.unexpected_ok:
        problems += [
            f"{n}: in the checkpoint but not in the live state" for n in saved if n not in state
        ]
    for name, obj in state.items():
        if name not in saved or name in planned:
            continue
        if isinstance(obj, torch.nn.Module):
            live_sd = unwrap(obj).state_dict()
            saved_sd = saved[name]
            if not isinstance(saved_sd, Mapping):
                problems.append(
                    f"{name}: checkpoint holds a {type(saved_sd).__name__}, not a state_dict"
                )
                continue
            if not strict.missing_ok:
                derivable = _derivable_keys(unwrap(obj))
                problems += [
                    f"{name}/{k}: missing from the checkpoint"
                    for k in live_sd
                    if k not in saved_sd and k not in derivable
                ]
            if not strict.unexpected_ok:
                problems += [
                    f"{name}/{k}: unexpected (not in the live module)"
                    for k in saved_sd
                    if k not in live_sd
                ]
            for k in live_sd.keys() & saved_sd.keys():
                _check_tensor(f"{name}/{k}", saved_sd[k], live_sd[k], problems)
        elif isinstance(obj, torch.Tensor):
            _check_tensor(name, saved[name], obj, problems)
        elif isinstance(obj, RNGState):
            problems += obj.mismatches(saved[name], name)
    return problems


def _derivable_keys(module: torch.nn.Module) -> set[str]:
    """Keys that submodules derive when a checkpoint lacks them (``statekeeper_derivable_keys``
    on the module's class, e.g. ``AveragedModel``'s ``n_calls`` for torch's layout)."""
    return {
        f"{prefix}.{key}" if prefix else key
        for prefix, sub in module.named_modules()
        for key in getattr(sub, "statekeeper_derivable_keys", ())
    }


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
    problems = _check(prepared, state, strict, planned=planned)
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


def read(
    directory: PathOrStorage, *, step: int | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """The plain nested state of a checkpoint (tensors on CPU), no live objects needed.

    ``directory`` is a run directory (the newest step, or ``step``) or a step directory.
    Tensors that shared memory when saved share it again. A local path in another format
    (``torch.save`` file, safetensors file or folder, Lightning, Accelerate, DCP) is read
    safely by :mod:`statekeeper.interop` (see docs/interop.md).
    """
    foreign = foreign_format(directory)
    if foreign is not None:
        return read_foreign(*foreign, step=step, progress=progress)
    with collector_paused():
        return read_step(locate(directory, step), progress).state
