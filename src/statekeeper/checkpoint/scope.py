"""Whether a save or load is one process's or the whole job's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

import torch
import torch.distributed as dist

from statekeeper.errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["Scope", "holds_dtensor", "is_distributed"]


class Scope(StrEnum):
    """Who takes part in a save or load.

    - ``AUTO``: the whole job when ``torch.distributed`` is initialized with more than one
      process, or with one process whose state holds DTensors (FSDP2 in a group of one),
      else this process (the default);
    - ``LOCAL``: this process alone, whatever the job (for example rank 0 saving a copy of
      a replicated model by itself);
    - ``DISTRIBUTED``: every rank of the default process group calls it together.
    """

    AUTO = "auto"
    LOCAL = "local"
    DISTRIBUTED = "distributed"


def holds_dtensor(state: Mapping[str, Any]) -> bool:
    """Whether a module, optimizer or tensor of ``state`` holds a ``DTensor`` (an FSDP2 or
    tensor-parallel model): only the distributed path can save or load it, whatever the
    number of ranks."""
    from torch.distributed.tensor import DTensor

    for obj in state.values():
        if isinstance(obj, torch.nn.Module):
            tensors: Iterable[Any] = (*obj.parameters(), *obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            tensors = (p for group in obj.param_groups for p in group["params"])
        else:
            tensors = (obj,)
        if any(isinstance(t, DTensor) for t in tensors):
            return True
    return False


def is_distributed(scope: Scope, state: Mapping[str, Any] | None = None) -> bool:
    """Whether ``scope`` means a collective save/load in this process: a job of several
    ranks, or (``AUTO`` and ``DISTRIBUTED`` alike) a ``state`` holding DTensors in a process
    group of one."""
    if not isinstance(scope, Scope):
        raise InvalidArgumentTypeError(f"scope must be a statekeeper.Scope, got {scope!r}")
    if scope is Scope.LOCAL:
        return False
    initialized = dist.is_available() and dist.is_initialized()
    if scope is Scope.DISTRIBUTED and not initialized:
        raise InvalidArgumentError(
            "scope=Scope.DISTRIBUTED needs torch.distributed.init_process_group() first"
        )
    if not initialized:
        return False
    return dist.get_world_size() > 1 or (state is not None and holds_dtensor(state))
