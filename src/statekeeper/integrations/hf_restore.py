"""How ``StatekeeperTrainer`` resumes from a ``checkpoint-N`` (:mod:`.transformers`): the
Trainer's own loading hooks, each reading the folder's statekeeper step (verified once,
before the model changes) in place of its pickled files, and the Trainer's plain way for a
folder the plain Trainer saved; the training loader put back where the saving run's stood
instead of the Trainer's skip, the RNG restored before its first batch."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from statekeeper.errors import StatekeeperWarning
from statekeeper.integrations import hf_loader
from statekeeper.integrations.held import apply_named
from statekeeper.integrations.hf_resume import LoadedCheckpoint, ours, verify_folder

__all__ = ["CheckpointLoading"]


class CheckpointLoading:
    """The Trainer's loading hooks, for :class:`.transformers.StatekeeperTrainerMixin` (which
    sets ``_sk_loaded`` and ``_sk_extra``)."""

    _sk_loaded: LoadedCheckpoint | None
    _sk_extra: dict[str, Any]

    def _sk_for(self, checkpoint: str | None, need: str = "") -> LoadedCheckpoint | None:
        """The verified contents of ``checkpoint``, or None for a folder the plain Trainer
        saved. Read once; read again when ``need`` was handed out already (the Trainer
        retries its training loop, ``auto_find_batch_size``, and loads again)."""
        if checkpoint is None or not ours(checkpoint):
            return None
        folder = Path(checkpoint)
        loaded = self._sk_loaded
        if loaded is None or loaded.folder != folder or (need and need not in loaded.state):
            self._sk_loaded = loaded = LoadedCheckpoint(folder, self._sk_extra)
        return loaded

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        self._sk_loaded = None  # a new resume reads its folder afresh
        # verified before the model changes; extra_state restored here
        if self._sk_for(resume_from_checkpoint) is None and self._sk_extra:
            warnings.warn(
                f"statekeeper: {resume_from_checkpoint} was saved by the plain Trainer: the "
                f"extra_state ({', '.join(self._sk_extra)}) is not in it and keeps its "
                "current value; resume from a checkpoint-N StatekeeperTrainer saved",
                StatekeeperWarning,
                stacklevel=3,
            )
        super()._load_from_checkpoint(resume_from_checkpoint, model)  # type: ignore[misc]

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        loaded = self._sk_for(checkpoint, "optimizer")
        if loaded is None:
            super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]
            return
        t: Any = self
        optimizer, scheduler = loaded.take("optimizer"), loaded.take("scheduler")
        if optimizer is not None and t.optimizer is not None:
            apply_named(t.optimizer, t.model, optimizer, loaded.folder)
        if scheduler is not None and t.lr_scheduler is not None:
            t.lr_scheduler.load_state_dict(scheduler)

    def _load_scaler(self, checkpoint: str | None) -> None:
        loaded = self._sk_for(checkpoint, "scaler")
        if loaded is None:
            super()._load_scaler(checkpoint)  # type: ignore[misc]
            return
        saved = loaded.take("scaler")
        scaler = getattr(getattr(self, "accelerator", None), "scaler", None)
        if saved is not None and scaler is not None:
            scaler.load_state_dict(saved)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        early = self._sk_loaded
        if early is not None and early.rng_early and early.folder == Path(str(checkpoint)):
            early.rng_early = False  # restored before the resumed epoch's first batch
            return
        loaded = self._sk_for(checkpoint, "rng")
        if loaded is None:
            super()._load_rng_state(checkpoint)  # type: ignore[misc]
            return
        saved = loaded.take_loader()  # a resume at an epoch's end: persistent workers
        loader = getattr(getattr(self, "callback_handler"), "train_dataloader", None)  # noqa: B009
        if saved is not None and hf_loader.persists_across_epochs(loader, saved):
            hf_loader.restore(loader, saved)  # they carried their generators over the end
        loaded.restore_rng()

    def _load_best_model(self) -> None:
        best = getattr(self, "state").best_model_checkpoint  # noqa: B009
        if best is not None and ours(best):
            verify_folder(Path(best))
        super()._load_best_model()  # type: ignore[misc]

    def get_train_dataloader(self) -> Any:
        """The Trainer's training loader, as a ``StatefulDataLoader`` whose workers save
        their random state (see :mod:`.hf_loader`)."""
        t: Any = self
        return hf_loader.build_stateful(t.accelerator, super().get_train_dataloader)  # type: ignore[misc]

    def _sk_resume_loader(self, dataloader: Any, num_batches: int) -> Any:
        """In place of the Trainer's skip: the loader put back where the saving run's
        stood, then the RNG restored before its first batch (None: the Trainer's skip)."""
        loaded = self._sk_loaded
        saved = loaded.take_loader() if loaded is not None else None
        if loaded is None or saved is None or not hf_loader.restore(dataloader, saved):
            return None
        loaded.restore_rng()
        loaded.rng_early = True
        return dataloader
