"""What the torchtitan checkpoint manager saves, beside the manager itself: the model parts
as one entry, containers that keep their own (name-keyed) state, and the model-only
exports (the export dtype; Hugging Face safetensors through the model's state dict
adapter)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from statekeeper.errors import InvalidArgumentError

__all__ = ["Delegate", "hf_load", "hf_save", "model_only_state", "refuse_unsupported"]

_INDEX = "model.safetensors.index.json"
_WEIGHTS = "model.safetensors"


def _model(parts: list[torch.nn.Module]) -> torch.nn.Module:
    """The model: one part (pipeline parallelism, with several, is refused when the manager
    is built)."""
    if len(parts) != 1:
        raise InvalidArgumentError(f"expected one model part, got {len(parts)}")
    return parts[0]


def model_only_state(parts: list[torch.nn.Module], dtype: torch.dtype | None) -> dict[str, Any]:
    """The model's state, floating tensors cast to ``dtype`` (None: as they are)."""
    state = _model(parts).state_dict()
    if dtype is None:
        return dict(state)
    return {
        k: v.to(dtype) if v.is_floating_point() and v.dtype != dtype else v
        for k, v in state.items()
    }


class Delegate:
    """A torchtitan container (``OptimizersContainer``, ``LRSchedulersContainer``) saved
    through its own ``state_dict``: the optimizers container flattens each optimizer's
    state to parameter names already (and is a ``torch.optim.Optimizer`` only in name)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def state_dict(self) -> Any:
        return self.obj.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.obj.load_state_dict(state)


def _full(value: Any) -> Any:
    full = getattr(value, "full_tensor", None)
    return full() if callable(full) else value


def _leader() -> bool:
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def hf_save(folder: Path, hf_state: dict[str, Any]) -> None:
    """Write ``hf_state`` as a Hugging Face safetensors folder (one file and its index),
    built beside ``folder`` and renamed into place (rank 0 writes; every rank gathers)."""
    tensors = {k: _full(v).detach().cpu().contiguous() for k, v in hf_state.items()}
    if not _leader():
        return
    built = folder.with_name(f"{folder.name}.partial-{uuid.uuid4().hex[:12]}")
    built.mkdir(parents=True)
    save_file(tensors, str(built / _WEIGHTS), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": dict.fromkeys(sorted(tensors), _WEIGHTS)}
    (built / _INDEX).write_text(json.dumps(index, indent=2) + "\n")
    for path in built.iterdir():
        with path.open("rb") as f:
            os.fsync(f.fileno())
    if folder.exists():
        shutil.rmtree(folder)
    built.rename(folder)


def hf_load(folder: Path, parts: list[torch.nn.Module], adapter: Any) -> None:
    """Load a Hugging Face safetensors folder into the model through ``adapter.from_hf``
    (a sharded model takes the full tensors and keeps its own shards)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if adapter is None:
        raise InvalidArgumentError("loading Hugging Face weights needs the model's sd_adapter")
    index = folder / _INDEX
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else [p.name for p in sorted(folder.glob("*.safetensors"))]
    )
    if not files:
        raise FileNotFoundError(f"{folder}: no safetensors files to load")
    hf_state: dict[str, torch.Tensor] = {}
    for name in files:
        hf_state.update(load_file(str(folder / name)))
    state = adapter.from_hf(hf_state)
    model = _model(parts)
    options = StateDictOptions(full_state_dict=True, strict=True)
    set_model_state_dict(model, state, options=options)


def refuse_unsupported(config: Any, parts: list[torch.nn.Module]) -> None:
    """What this manager would save or load wrong: refused when it is built."""
    if config.initial_load_in_hf_quantized:
        raise InvalidArgumentError(
            "checkpoint.initial_load_in_hf_quantized is not supported by "
            "StatekeeperCheckpointManager yet; use torchtitan's CheckpointManager for that load"
        )
    names = sorted(k for part in parts for k in part.state_dict())
    if len(parts) > 1 or not _same_on_every_rank(names):
        raise InvalidArgumentError(
            "pipeline parallelism (ranks holding different model parts) is not supported by "
            "StatekeeperCheckpointManager yet: each rank's optimizer state would be saved as "
            "rank 0's; use torchtitan's CheckpointManager for pipeline-parallel runs"
        )


def _same_on_every_rank(names: list[str]) -> bool:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return True
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, digest)  # a digest of names: no tensors, no state
    return len(set(everyone)) == 1
