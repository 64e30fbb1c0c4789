"""Hugging Face Accelerate: ``save_state`` / ``load_state`` as statekeeper steps.

``save_state(accelerator)`` saves what ``Accelerator.save_state`` would, as one committed
statekeeper step (atomic, checksummed, no pickle): every prepared model (unwrapped), every
optimizer (keyed by parameter name), every scheduler, the grad scaler, the data loaders that
keep a position (``DataLoaderConfiguration(use_stateful_dataloader=True)``), every object
registered with ``register_for_checkpointing``, every RNG (Python, numpy, torch, CUDA) and
the accelerator's gradient-accumulation ``step``. ``load_state(accelerator)`` restores all of
it in place, every byte verified before a live tensor changes. ``has_checkpoint(accelerator)``
says whether there is a step to resume from (a first run has none).

Each process saves and restores its own loader positions and RNG states. The workers of a
stateful loader save their random state too (random augmentation in ``__getitem__``
resumes exactly): every call here readies the prepared loaders for it, so call
``has_checkpoint`` (or ``load_state``) before the first batch; a save whose workers started
before that warns, naming the fix.

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

from statekeeper.catalog.info import CheckpointInfo, RestoreInfo
from statekeeper.catalog.listing import list_checkpoints
from statekeeper.checkpoint.load import load
from statekeeper.checkpoint.retention_policies import KeepLatest
from statekeeper.checkpoint.save import save
from statekeeper.distributed.per_rank import PerRank
from statekeeper.errors import InvalidArgumentError
from statekeeper.integrations.accelerate_loaders import AccelerateLoader, stateful_loaders
from statekeeper.loop.retention import Retainer
from statekeeper.state.rng import RNGState
from statekeeper.storage.local import LocalStorage

__all__ = ["has_checkpoint", "load_state", "save_state", "state_of"]

_STEP = "accelerator_step"


def _inner(obj: Any, attribute: str) -> Any:
    """The object a wrapper of Accelerate's holds (``AcceleratedOptimizer.optimizer``...)."""
    return getattr(obj, attribute, obj)


_UNSUPPORTED = {"DEEPSPEED", "MEGATRON_LM", "XLA"}


def _check(accelerator: Any) -> None:
    """Refuse what this integration would save wrong or not at all."""
    kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
    fsdp1 = kind == "FSDP" and not getattr(accelerator, "is_fsdp2", False)
    if kind in _UNSUPPORTED or fsdp1:
        raise InvalidArgumentError(
            f"statekeeper.integrations.accelerate does not support {kind}"
            f"{' (FSDP1: use FSDP2, fsdp_version=2)' if fsdp1 else ''} yet; use "
            "accelerator.save_state / load_state there"
        )
    hooks = getattr(accelerator, "_save_model_state_pre_hook", {}) or getattr(
        accelerator, "_load_model_state_pre_hook", {}
    )
    if hooks:
        raise InvalidArgumentError(
            "the accelerator has save/load state pre-hooks (register_save_state_pre_hook...), "
            "which statekeeper's save and load do not call; use accelerator.save_state there"
        )
    if accelerator.project_configuration.save_on_each_node and accelerator.num_processes > 1:
        raise InvalidArgumentError(
            "ProjectConfiguration(save_on_each_node=True) (node-local disks) is not supported: "
            "a statekeeper job saves into one directory that every rank can write"
        )


def state_of(accelerator: Any) -> dict[str, Any]:
    """The app state of ``accelerator``: what its ``save_state`` would save, by name."""
    _check(accelerator)
    state: dict[str, Any] = {}
    for i, model in enumerate(accelerator._models):
        state[f"model_{i}" if i else "model"] = accelerator.unwrap_model(model)
    for i, opt in enumerate(accelerator._optimizers):
        state[f"optimizer_{i}" if i else "optimizer"] = _inner(opt, "optimizer")
    for i, scheduler in enumerate(accelerator._schedulers):
        state[f"scheduler_{i}" if i else "scheduler"] = _inner(scheduler, "scheduler")
    if getattr(accelerator, "scaler", None) is not None:
        state["scaler"] = accelerator.scaler
    for i, loader in enumerate(stateful_loaders(accelerator)):
        name = f"dataloader_{i}" if i else "dataloader"
        state[name] = PerRank(AccelerateLoader(name, loader))  # each rank's own
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
    overwrite: bool = False,
) -> CheckpointInfo:
    """Save ``accelerator``'s state as a step of the run ``output_dir`` (see the module
    docstring). Call it on every process: in a multi-process job the save is collective and
    the main process commits. ``step`` (the training step, say) overrides the
    configuration's ``iteration`` and sets it past itself; ``overwrite`` replaces a step
    that exists."""
    run, automatic = _where(accelerator, output_dir)
    config = accelerator.project_configuration
    number = step if step is not None else int(config.iteration)
    info = save(run, state_of(accelerator), step=number, overwrite=overwrite)
    config.iteration = number + 1
    if automatic and config.total_limit is not None and accelerator.is_main_process:
        limit = KeepLatest(int(config.total_limit))
        # the step is committed: a step retention cannot remove is warned about (and tried
        # again at the next save), never a failure of this save
        Retainer(LocalStorage(run), limit).apply(number, protect=(number,))
    return info


def has_checkpoint(accelerator: Any, input_dir: str | os.PathLike[str] | None = None) -> bool:
    """Whether the run ``input_dir`` (by default the one ``load_state`` reads) holds a
    committed step to resume from: False on a first run, where ``load_state`` would raise.
    Call it on every process, before the first batch (it readies the loaders' workers, see
    the module docstring)::

        step = load_state(accelerator).step if has_checkpoint(accelerator) else 0
    """
    state_of(accelerator)  # readies the loaders, refuses what is not supported
    run, _ = _where(accelerator, input_dir)
    return run.is_dir() and bool(list_checkpoints(run))


def load_state(
    accelerator: Any,
    input_dir: str | os.PathLike[str] | None = None,
    *,
    step: int | None = None,
) -> RestoreInfo:
    """Restore ``accelerator``'s state from the newest step of ``input_dir`` (or ``step``).
    Call it on every process (in a multi-process job the load is collective)."""
    run, _ = _where(accelerator, input_dir)
    state: MutableMapping[str, Any] = state_of(accelerator)
    info = load(run, state, step=step)
    values: Mapping[str, Any] = info.values
    accelerator.step = int(values.get(_STEP, accelerator.step))
    accelerator.project_configuration.iteration = info.step + 1
    return info
