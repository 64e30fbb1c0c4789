"""Hugging Face Accelerate: ``save_state`` / ``load_state`` as statekeeper steps.

``save_state(accelerator)`` saves what ``Accelerator.save_state`` would, as one committed
statekeeper step (atomic, checksummed, no pickle): every prepared model (unwrapped), every
optimizer (keyed by parameter name), every scheduler, the grad scaler, the data loaders that
keep a position (``DataLoaderConfiguration(use_stateful_dataloader=True)``), every object
registered with ``register_for_checkpointing``, every RNG (Python, numpy, torch, CUDA) and
the accelerator's gradient-accumulation ``step``. ``load_state(accelerator)`` restores all of
it in place, every byte verified before a live tensor changes.

Where the steps go follows the accelerator's ``ProjectConfiguration``: with
``automatic_checkpoint_naming`` the run directory is ``<project_dir>/checkpoints``, the step
is the configuration's ``iteration`` (which a save advances and a load sets past the step
loaded, as a resumed run needs), and ``total_limit`` keeps that many newest steps. Else
``output_dir`` / ``input_dir`` name the run directory and ``step`` the step (the
accelerator's ``save_iteration`` by default).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from statekeeper.checkpoint.info import CheckpointInfo, RestoreInfo
from statekeeper.checkpoint.load import load
from statekeeper.checkpoint.policies import KeepLatest
from statekeeper.checkpoint.retention import apply_retention
from statekeeper.checkpoint.save import save
from statekeeper.errors import InvalidArgumentError
from statekeeper.state.rng import RNGState
from statekeeper.storage.local import LocalStorage

__all__ = ["load_state", "save_state", "state_of"]

_STEP = "accelerator_step"


def _inner(obj: Any, attribute: str) -> Any:
    """The object a wrapper of Accelerate's holds (``AcceleratedOptimizer.optimizer``...)."""
    return getattr(obj, attribute, obj)


def state_of(accelerator: Any) -> dict[str, Any]:
    """The app state of ``accelerator``: what its ``save_state`` would save, by name."""
    state: dict[str, Any] = {}
    for i, model in enumerate(accelerator._models):
        state[f"model_{i}" if i else "model"] = accelerator.unwrap_model(model)
    for i, opt in enumerate(accelerator._optimizers):
        state[f"optimizer_{i}" if i else "optimizer"] = _inner(opt, "optimizer")
    for i, scheduler in enumerate(accelerator._schedulers):
        state[f"scheduler_{i}" if i else "scheduler"] = _inner(scheduler, "scheduler")
    if getattr(accelerator, "scaler", None) is not None:
        state["scaler"] = accelerator.scaler
    stateful = [d for d in accelerator._dataloaders if hasattr(d, "state_dict")]
    for i, loader in enumerate(stateful):
        state[f"dataloader_{i}" if i else "dataloader"] = loader
    for i, obj in enumerate(accelerator._custom_objects):
        state[f"custom_{i}"] = obj
    state["rng"] = RNGState()
    state[_STEP] = accelerator.step
    return state


def _where(accelerator: Any, directory: str | os.PathLike[str] | None) -> tuple[Path, bool]:
    config = accelerator.project_configuration
    if directory is not None:
        return Path(directory).expanduser(), False
    if not config.automatic_checkpoint_naming:
        raise InvalidArgumentError(
            "no directory given and the accelerator's ProjectConfiguration has no "
            "automatic_checkpoint_naming: pass the run directory"
        )
    return Path(accelerator.project_dir) / "checkpoints", True


def save_state(
    accelerator: Any,
    output_dir: str | os.PathLike[str] | None = None,
    *,
    step: int | None = None,
) -> CheckpointInfo:
    """Save ``accelerator``'s state as a step of the run ``output_dir`` (see the module
    docstring); rank 0 commits in a multi-process job, every rank takes part."""
    run, automatic = _where(accelerator, output_dir)
    config = accelerator.project_configuration
    number = step if step is not None else int(config.iteration)
    info = save(run, state_of(accelerator), step=number)
    if automatic and config.total_limit is not None and accelerator.is_main_process:
        apply_retention(LocalStorage(run), KeepLatest(int(config.total_limit)))
    config.iteration = number + 1
    return info


def load_state(
    accelerator: Any,
    input_dir: str | os.PathLike[str] | None = None,
    *,
    step: int | None = None,
) -> RestoreInfo:
    """Restore ``accelerator``'s state from the newest step of ``input_dir`` (or ``step``)."""
    run, _ = _where(accelerator, input_dir)
    state: MutableMapping[str, Any] = state_of(accelerator)
    info = load(run, state, step=step)
    values: Mapping[str, Any] = info.values
    accelerator.step = int(values.get(_STEP, accelerator.step))
    accelerator.project_configuration.iteration = info.step + 1
    return info
