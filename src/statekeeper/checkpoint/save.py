"""``save``: capture a state, write it pickle-free, commit it atomically."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, overload

import torch

from statekeeper.checkpoint.async_save import AsyncWriter, PendingSave
from statekeeper.checkpoint.info import CheckpointInfo
from statekeeper.checkpoint.location import PathOrStorage, resolve_storage, validate_step
from statekeeper.checkpoint.reader import Progress
from statekeeper.checkpoint.writer import write_step
from statekeeper.data.torchdata import (
    capture_loader,
    is_stateful_dataloader,
    loader_generators,
    refuse_plain_dataloader,
)
from statekeeper.distributed.scope import Scope, is_distributed
from statekeeper.errors import InvalidArgumentError
from statekeeper.format.tensors import DEFAULT_SHARD_BYTES
from statekeeper.state.modules import unwrap
from statekeeper.state.optimizer import parameter_names, to_named
from statekeeper.state.rng import RNGState
from statekeeper.stateful import is_stateful

__all__ = ["capture", "frozen_names", "save"]


def capture(state: Mapping[str, Any]) -> dict[str, Any]:
    """Each entry's ``state_dict()`` (for Stateful objects) or the plain value itself."""
    if not isinstance(state, Mapping):
        raise InvalidArgumentError(
            f"state must be a mapping of names to objects, got {type(state).__name__}"
        )
    for name in state:
        if not isinstance(name, str) or not name or name.startswith("$") or "/" in name:
            raise InvalidArgumentError(
                f"state name {name!r} is not allowed: "
                "use a non-empty str without '/' or a leading '$'"
            )
    # parameter names are only needed to key optimizer state: ~4 ms per 3,300 parameters
    # otherwise spent in an async save's stall (bench/io.py, async rows)
    with_optimizer = any(isinstance(obj, torch.optim.Optimizer) for obj in state.values())
    names = parameter_names(state) if with_optimizer else {}
    owned = loader_generators(state)
    for obj in state.values():
        if isinstance(obj, RNGState) and any(id(g) in owned for g in obj.generators.values()):
            raise InvalidArgumentError(
                "a generator registered with the RNG state is also a data loader's generator; "
                "statekeeper saves it with the loader (in the right order): unregister it"
            )
    captured: dict[str, Any] = {}
    # RNG first: a state_dict() that draws random numbers must not change what is saved
    for name in sorted(state, key=lambda n: not isinstance(state[n], RNGState)):
        obj = state[name]
        refuse_plain_dataloader(name, obj)
        if isinstance(obj, torch.optim.Optimizer):
            try:
                captured[name] = to_named(name, obj, names)
            except ValueError as exc:
                raise InvalidArgumentError(str(exc)) from None
        elif is_stateful_dataloader(obj):
            captured[name] = capture_loader(name, obj)
        elif isinstance(obj, torch.nn.Module):
            captured[name] = unwrap(obj).state_dict()
        else:
            captured[name] = obj.state_dict() if is_stateful(obj) else obj
    return {name: captured[name] for name in state}


def frozen_names(state: Mapping[str, Any]) -> set[str]:
    """Tensor names of parameters that do not require grad (stored in shards of their own)."""
    names: set[str] = set()
    for name, obj in state.items():
        if isinstance(obj, torch.nn.Module):
            params = unwrap(obj).named_parameters()
            names.update(f"{name}/{p}" for p, param in params if not param.requires_grad)
    return names


_writers: dict[str, AsyncWriter] = {}  # per run directory: one save in flight, staging reused


@overload
def save(
    directory: PathOrStorage,
    state: Mapping[str, Any],
    *,
    step: int,
    metrics: Mapping[str, Any] | None = ...,
    overwrite: bool = ...,
    shard_bytes: int = ...,
    blocking: Literal[True] = ...,
    scope: Scope = ...,
    progress: Progress | None = ...,
) -> CheckpointInfo: ...


@overload
def save(
    directory: PathOrStorage,
    state: Mapping[str, Any],
    *,
    step: int,
    metrics: Mapping[str, Any] | None = ...,
    overwrite: bool = ...,
    shard_bytes: int = ...,
    blocking: Literal[False],
    scope: Scope = ...,
    progress: None = ...,
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
) -> CheckpointInfo | PendingSave:
    """Save ``state`` as committed step ``step`` of the run ``directory``.

    ``state`` maps names to Stateful objects (anything with ``state_dict``/``load_state_dict``)
    or plain values. The step becomes visible only once all its bytes are durable. Raises
    ``StepExistsError`` if the step is committed already (unless ``overwrite=True``),
    ``WriterConflictError`` if another live writer holds the directory, and
    ``UnsupportedValueError`` (naming the key path) for a value that would need pickle.

    With ``blocking=False`` the call returns once the tensors are copied to host memory and
    a background thread writes and commits: a :class:`PendingSave` whose ``wait()`` returns
    the CheckpointInfo. The next save into the same directory waits for it and raises its
    error if it failed.

    In a multi-process job (``torch.distributed`` initialized, more than one rank) the
    default ``scope=Scope.AUTO`` makes this a collective: call it on every rank. Sharded
    (FSDP2/DTensor) and replicated (DDP) state is written once through
    ``torch.distributed.checkpoint``, each rank's RNG and loader state is kept per rank, and
    rank 0 commits once all ranks have written (see docs/distributed.md). Pass
    ``scope=Scope.LOCAL`` to save from one process alone.

    ``progress(done, total)`` (blocking single-process saves) is called with the tensor bytes
    written so far.
    """
    storage = resolve_storage(directory)
    validate_step(step)
    if is_distributed(scope, state):
        if not blocking:
            raise InvalidArgumentError(
                "blocking=False is not supported for distributed saves yet; save with "
                "blocking=True (every rank), or scope=Scope.LOCAL from one process"
            )
        from statekeeper.distributed.save import save_distributed

        return save_distributed(storage, state, step=step, metrics=metrics, overwrite=overwrite)
    options: dict[str, Any] = {
        "frozen": frozen_names(state),
        "overwrite": overwrite,
        "shard_bytes": shard_bytes,
    }
    if progress is not None:
        if not blocking:
            raise InvalidArgumentError("progress= is only for blocking single-process saves")
        options["progress"] = progress
    if not blocking:
        writer = _writers.setdefault(storage.describe(), AsyncWriter())
        prepared = writer.prepare(capture(state), metrics)
        return writer.submit(storage, prepared, step=step, lock=storage.writer_lock(), **options)
    with storage.writer_lock():
        return write_step(storage, capture(state), step=step, metrics=metrics, **options)
