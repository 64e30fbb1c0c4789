"""torchtitan: a checkpoint manager on its pluggable ``BaseCheckpointManager`` contract.

Set the trainer's checkpoint config to this manager's ``Config`` (same options as
torchtitan's own ``CheckpointManager``, with the same meaning)::

    from statekeeper.integrations.torchtitan import StatekeeperCheckpointManager

    config.checkpoint = StatekeeperCheckpointManager.Config(enable=True, interval=500,
                                                            keep_latest_k=3)

Each save is one statekeeper step of the run ``<dump folder>/<folder>``: atomic,
checksummed, no pickle. It holds the model parts, the optimizers (torchtitan's flattened,
name-keyed state), the LR schedulers, each data-parallel rank's data loader position (as
torchdata's plain state, never torchtitan's pickled bytes), the trainer's ``train_state``
and every RNG. ``async_mode="async"`` (or ``"async_with_pinned_mem"``) saves in the
background with statekeeper's asynchronous writer: ``save`` returns once the tensors are
copied, ``maybe_wait_for_saving`` waits for the commit.

Loading follows torchtitan: the newest step of the run (or ``load_step``), else
``initial_load_path`` (a statekeeper run or step; Hugging Face safetensors with
``initial_load_in_hf``), else a fresh start; ``exclude_from_loading`` leaves those entries
as they are; a model-only step (the seed checkpoint, a last save with
``last_save_model_only``) restores the model alone. Every byte is verified before a live
tensor changes. A torchtitan DCP checkpoint is not read directly (DCP's metadata is
pickled): convert it once with ``statekeeper convert``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from torchtitan.components.checkpointer.base import (
    DATALOADER,
    LR_SCHEDULER,
    MODEL,
    OPTIMIZER,
    BaseCheckpointManager,
)

from statekeeper.catalog.listing import list_checkpoints
from statekeeper.checkpoint.load import Strict, load
from statekeeper.checkpoint.retention_policies import KeepLatest
from statekeeper.distributed.per_rank import PerRank
from statekeeper.errors import InvalidArgumentError, KeyMismatchError
from statekeeper.integrations.titan_loader import DataParallelLoader
from statekeeper.integrations.titan_parts import (
    Delegate,
    hf_load,
    hf_save,
    model_only_state,
    refuse_unsupported,
)
from statekeeper.loop.checkpointer import RNG_ENTRY, Checkpointer
from statekeeper.state.rng import RNGState

__all__ = ["AsyncMode", "StatekeeperCheckpointManager"]

_MODEL_ONLY = "model_only"  # a step's metric: it holds the model alone
_KEYS_FIX = (
    "Leave entries out of the load with checkpoint.exclude_from_loading, or load the model "
    "alone with checkpoint.initial_load_model_only"
)


class AsyncMode(StrEnum):
    """When ``save`` returns: once written (``DISABLED``) or once copied (the others)."""

    DISABLED = "disabled"
    ASYNC = "async"
    ASYNC_WITH_PINNED_MEM = "async_with_pinned_mem"


class StatekeeperCheckpointManager(BaseCheckpointManager):  # type: ignore[misc]
    """torchtitan checkpoints as statekeeper steps (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseCheckpointManager.Config):  # type: ignore[misc]
        async_mode: AsyncMode = AsyncMode.DISABLED
        """Synchronous saves, or statekeeper's background writer."""

        def __post_init__(self) -> None:
            BaseCheckpointManager.Config.__post_init__(self)
            try:
                self.async_mode = AsyncMode(str(self.async_mode).lower())
            except ValueError:
                raise InvalidArgumentError(
                    f"async_mode must be one of {', '.join(m.value for m in AsyncMode)}, "
                    f"got {self.async_mode!r}"
                ) from None

    def __init__(
        self,
        config: Config,
        *,
        dataloader: Any,
        model_parts: list[torch.nn.Module],
        optimizers: Any,
        lr_schedulers: Any,
        states: dict[str, Any],
        sd_adapter: Any,
        base_folder: str = "",
    ) -> None:
        self.enable = config.enable
        if not self.enable:
            return
        self.save_future = None
        self.config = config
        self.folder = os.path.join(base_folder, config.folder)
        self.sd_adapter = sd_adapter
        if config.last_save_in_hf and sd_adapter is None:
            raise InvalidArgumentError(
                "checkpoint.last_save_in_hf needs the model's state dict adapter (sd_adapter)"
            )
        refuse_unsupported(config, model_parts)
        self.model_parts = model_parts
        self.states = states
        self.states.update(
            {
                MODEL: model_parts[0],
                OPTIMIZER: Delegate(optimizers),
                LR_SCHEDULER: Delegate(lr_schedulers),
            }
        )
        if dataloader is not None:
            # each data-parallel rank's own position; its iterator is rebuilt on load before
            # the RNG is restored, as the saving run had built it before it saved
            self.states[DATALOADER] = PerRank(DataParallelLoader(dataloader))
        self.rng = RNGState()
        self._stale: set[int] = set()  # steps past the one loaded: saved again, they replace
        self._checkpointer: Checkpointer | None = None
        if not config.load_only:
            keep = KeepLatest(config.keep_latest_k) if config.keep_latest_k else None
            self._checkpointer = Checkpointer(
                self.folder, keep=keep, blocking=config.async_mode is AsyncMode.DISABLED
            )

    def __del__(self) -> None:
        self.close()

    # ---- save -------------------------------------------------------------------------------

    def _should_save(self, curr_step: int, last_step: bool) -> bool:
        if self.config.load_only:
            return False
        first = curr_step == 1 and self.config.enable_first_step_checkpoint
        return first or last_step or curr_step % self.config.interval == 0

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        if not self._should_save(curr_step, last_step):
            return False
        checkpointer = self._checkpointer
        if checkpointer is None:
            raise InvalidArgumentError(
                f"save(curr_step={curr_step}) on a closed checkpoint manager: build a new one"
            )
        self.maybe_wait_for_saving()
        model_only = curr_step == 0 or (last_step and self.config.last_save_model_only)
        if model_only and self.config.last_save_in_hf and curr_step:
            hf_save(
                Path(self.folder) / f"hf-step-{curr_step}",
                self.sd_adapter.to_hf(self._model(curr_step)),
            )
            return True
        entries = (
            {MODEL: self._model(curr_step)}
            if model_only
            else {k: v for k, v in self.states.items() if v is not None}
        )
        metrics = {_MODEL_ONLY: 1} if model_only else None
        # a step of the run rolled back from (load_step) is replaced, as torchtitan's own
        # manager overwrites it
        stale = curr_step in self._stale
        self._stale.discard(curr_step)
        pending = checkpointer.save(curr_step, entries, metrics, overwrite=stale)
        if model_only:
            checkpointer.wait()
        elif self.config.async_mode is not AsyncMode.DISABLED:
            self.save_future = pending  # type: ignore[assignment]
        return True

    def _model(self, step: int) -> Any:
        """What a model-only save holds: the model as it is for the seed checkpoint (step
        0); for the last one, floating tensors in the export dtype."""
        if step:
            return model_only_state(self.model_parts, getattr(torch, self.config.export_dtype))
        return self.states[MODEL]

    def _wait_for_saving(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.wait()
        self.save_future = None

    def _maybe_wait_for_staging(self) -> None:
        # statekeeper's background save returns once the tensors are copied: nothing is
        # still being staged when ``save`` returns
        return

    def _close(self) -> None:
        checkpointer, self._checkpointer = getattr(self, "_checkpointer", None), None
        if checkpointer is not None:
            checkpointer.close()

    # ---- load -------------------------------------------------------------------------------

    def _load(self, step: int = -1) -> bool:
        self.maybe_wait_for_saving()
        steps = {i.step: i for i in list_checkpoints(self.folder)} if _exists(self.folder) else {}
        if step != -1 and step not in steps:
            raise FileNotFoundError(
                f"checkpoint.load_step={step}: no such committed step in {self.folder} "
                f"(steps: {sorted(steps) or 'none'}; keep_latest_k may have removed it)"
            )
        if not steps:
            return self._initial_load()
        chosen = step if step != -1 else max(steps)
        self._stale = {s for s in steps if s > chosen}
        if _model_only(steps[chosen]):
            if chosen and step == -1 and any(not _model_only(i) for i in steps.values()):
                newest_full = max(s for s, i in steps.items() if not _model_only(i))
                raise InvalidArgumentError(
                    f"the newest step of {self.folder}, {chosen}, is the last save of a "
                    f"finished run and holds the model alone (last_save_model_only): to go on "
                    f"training from the newest full step pass "
                    f"checkpoint.load_step={newest_full}"
                )
            # the seed checkpoint, or a model-only step asked for: the model alone (its
            # RNG is not this run's to restore)
            model = {MODEL: self.states[MODEL]}
            load(self.folder, model, step=chosen, strict=Strict.ALLOW_UNEXPECTED)
            return True
        state = self._states_to_load()
        try:
            if step == -1 and self._checkpointer is not None:
                self._checkpointer.restore_latest(state, strict=self._strict())
            else:
                everything = {**state, RNG_ENTRY: self.rng}
                load(self.folder, everything, step=chosen, strict=self._strict())
        except KeyMismatchError as exc:
            raise KeyMismatchError(exc.problems, _KEYS_FIX) from None
        return True

    def _strict(self) -> Strict:
        return Strict.ALLOW_UNEXPECTED if self.config.exclude_from_loading else Strict.EXACT

    def _states_to_load(self) -> dict[str, Any]:
        for key in self.config.exclude_from_loading:
            if key not in self.states:
                raise InvalidArgumentError(
                    f"checkpoint.exclude_from_loading names {key!r}, which is not saved "
                    f"(entries: {', '.join(sorted(self.states))})"
                )
        return {
            k: v
            for k, v in self.states.items()
            if v is not None and k not in self.config.exclude_from_loading
        }

    def _initial_load(self) -> bool:
        path = self.config.initial_load_path
        if self.config.initial_load_in_hf:
            source = path or getattr(self.sd_adapter, "hf_assets_path", None)
            if not source:
                raise InvalidArgumentError(
                    "initial_load_in_hf needs checkpoint.initial_load_path or the model's "
                    "hf_assets_path"
                )
            hf_load(Path(source), self.model_parts, self.sd_adapter)
            return True
        if not path:
            return False  # a fresh start
        try:
            if self.config.initial_load_model_only:
                load(path, {MODEL: self.states[MODEL]}, strict=Strict.ALLOW_UNEXPECTED)
            else:
                full = {**self._states_to_load(), RNG_ENTRY: self.rng}
                load(path, full, strict=self._strict())
        except KeyMismatchError as exc:
            raise KeyMismatchError(exc.problems, _KEYS_FIX) from None
        return True


def _model_only(info: Any) -> bool:
    return bool((info.metrics or {}).get(_MODEL_ONLY) == 1)


def _exists(folder: str) -> bool:
    return "://" in folder or Path(folder).is_dir()
