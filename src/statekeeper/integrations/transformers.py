"""The transformers ``Trainer``, saving each ``checkpoint-N`` through statekeeper.

Replace ``Trainer`` by :class:`StatekeeperTrainer` (or mix :class:`StatekeeperTrainerMixin`
into a Trainer subclass of your own, before it) and every checkpoint the Trainer saves is:

- **complete or absent**: built as ``checkpoint-N.partial`` and renamed to ``checkpoint-N``
  once flushed, so ``get_last_checkpoint`` and ``train(resume_from_checkpoint=True)`` never
  pick a folder a kill interrupted (see :mod:`statekeeper.integrations.hf_layout`);
- **pickle-free**: the model folder is what ``save_pretrained`` writes (safetensors and
  JSON, so ``from_pretrained("checkpoint-N")`` works as before) and ``trainer_state.json``;
  the optimizer (keyed by parameter name, not position), the LR scheduler, the grad scaler
  and every RNG (Python, numpy, torch, CUDA; each process its own) are one statekeeper step
  in the folder, in place of the pickled ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``,
  ``rng_state*.pth`` and ``training_args.bin`` (written as ``training_args.json``);
- **checksummed**: the step records the checksum of every file of the folder, and a resume
  verifies all of them, and every byte of the step, before the model or the optimizer
  changes;
- **rotated by step number**: ``save_total_limit`` becomes ``KeepLatest(save_total_limit)``
  (any statekeeper ``Retention`` may be passed as ``retention=``), ranked by the step in the
  name, never by modification time; the newest folder and the best one
  (``load_best_model_at_end``) always stay.

Resuming goes through the Trainer's own entry point, ``train(resume_from_checkpoint=...)``
(a path, or ``True`` for the newest folder of ``output_dir``; on a first run, with no folder
yet, ``True`` starts from scratch and logs so). A folder saved by the plain Trainer (no
statekeeper step in it) is still resumed, the Trainer's own way.

The training loader resumes where the saving run's stood, its workers' random state
included (each rank its own; see :mod:`.hf_loader`), and ``extra_state={"ema": ema}``
puts objects of the user's own (``state_dict`` / ``load_state_dict``: an EMA, a callback)
into every step, restored when the resume reads the folder, before training continues.

Supported: one process or DDP (``torchrun``); DeepSpeed, FSDP, XLA and SageMaker model
parallel are refused at construction. It overrides private Trainer methods
(``_save_checkpoint``, ``_load_from_checkpoint``, ``_load_optimizer_and_scheduler``,
``_load_scaler``, ``_load_rng_state``, ``_load_best_model``): the ``transformers`` extra
pins the versions tested (docs/integrations.md).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from transformers import Trainer

from statekeeper.checkpoint.policies import KeepLatest, Retention
from statekeeper.checkpoint.save import save
from statekeeper.checkpoint.scope import Scope
from statekeeper.errors import InvalidArgumentError, StatekeeperWarning
from statekeeper.integrations import hf_layout, hf_loader, hf_parts
from statekeeper.integrations.held import apply_named, named_state
from statekeeper.integrations.hf_resume import (
    EXTRA,
    LoadedCheckpoint,
    checked_extra,
    ours,
    verify_folder,
)
from statekeeper.state.rng import RNGState

__all__ = ["StatekeeperTrainer", "StatekeeperTrainerMixin"]

_log = logging.getLogger(__name__)


class StatekeeperTrainerMixin:
    """Put before ``transformers.Trainer`` in a subclass's bases (see the module docstring).

    ``retention`` (keyword, optional): the statekeeper ``Retention`` policy for the
    ``checkpoint-N`` folders; default ``KeepLatest(args.save_total_limit)``, or keep all.
    ``extra_state`` (keyword, optional): objects of your own with ``state_dict()`` and
    ``load_state_dict()`` by name (``{"ema": ema}``), saved in every step (rank 0's; wrap
    one that differs between ranks in ``statekeeper.PerRank``) and restored in place on
    resume, before training continues.
    """

    _sk_retention: Retention | None
    _sk_loaded: LoadedCheckpoint | None
    _sk_extra: dict[str, Any]

    def __init__(
        self,
        *args: Any,
        retention: Retention | None = None,
        extra_state: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if retention is not None and not isinstance(retention, Retention):
            raise InvalidArgumentError(
                f"retention must be a statekeeper Retention (KeepLatest(3)...), got {retention!r}"
            )
        self._sk_retention = retention
        self._sk_extra = checked_extra(extra_state)
        self._sk_loaded = None
        self._sk_refuse_unsupported()
        getattr(self, "add_callback")(hf_loader.CheckLoader())  # noqa: B009

    # ---- what this integration does not cover -------------------------------------------

    def _sk_refuse_unsupported(self) -> None:
        t: Any = self
        refused = [
            name
            for name, on in (
                ("DeepSpeed", t.is_deepspeed_enabled),
                ("FSDP", t.is_fsdp_enabled or getattr(t, "is_fsdp_xla_enabled", False)),
                ("SageMaker model parallel", hf_parts.sagemaker_mp()),
                ("tensor parallelism", (getattr(t.args, "tp_size", 1) or 1) > 1),
            )
            if on
        ]
        if refused:
            raise InvalidArgumentError(
                f"StatekeeperTrainer does not support {refused[0]} yet: its checkpoints are "
                "written by that engine; use transformers.Trainer there"
            )
        if getattr(t.args, "save_safetensors", True) is False:
            raise InvalidArgumentError(
                "TrainingArguments(save_safetensors=False) saves the model pickled; "
                "StatekeeperTrainer needs save_safetensors=True"
            )

    def _sk_keep(self, run_dir: Path, best: str | None) -> Retention | None:
        """The retention policy: the one given, else ``save_total_limit`` folders in all,
        the best one counted among them as the Trainer counts it (with a limit of 1 and a
        best folder that is not the newest, the Trainer keeps both)."""
        if self._sk_retention is not None:
            return self._sk_retention
        limit = getattr(self, "args").save_total_limit  # noqa: B009
        if not limit:
            return None
        newest = sorted(hf_layout.checkpoints(run_dir))[-limit:]
        outside = best is not None and Path(best).name not in {f"checkpoint-{s}" for s in newest}
        return KeepLatest(limit - 1 if outside and limit > 1 else limit)

    # ---- save ---------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        t: Any = self
        args = t.args
        step = int(t.state.global_step)
        if t.hp_search_backend is None and trial is None:
            t.store_flos()
        run_dir = Path(t._get_output_dir(trial=trial))
        built = hf_layout.staging(run_dir, step)
        final = run_dir / f"{hf_layout.PREFIX}-{step}"
        if args.should_save:
            hf_layout.remove_leftovers(run_dir)
        hf_parts.barrier(t)
        t.save_model(str(built), _internal_call=True)
        self._sk_note_best(run_dir, step, final)
        if args.should_save:
            hf_parts.args_as_json(t, built)
            hf_parts.export_callback_state(t)
            t.state.save_to_json(str(built / "trainer_state.json"))
        entries: dict[str, Any] = {}
        if not args.save_only_model:
            entries.update(self._sk_training_state())
        entries["files"] = hf_layout.file_checksums(built) if args.should_save else {}
        # the framework's files are flushed while the step is written (the disk's two
        # flushes overlap: about 30% off a 128 MiB save, bench/integrations.py)
        # (the main process's: it wrote them, and it commits the folder)
        with ThreadPoolExecutor(1, thread_name_prefix="statekeeper-flush") as pool:
            flushed = (
                pool.submit(hf_layout.flush, built, entries["files"]) if args.should_save else None
            )
            save(built, entries, step=step, scope=Scope.AUTO)
            if flushed is not None:
                flushed.result()
        if args.should_save:
            (built / ".statekeeper.lock").unlink(missing_ok=True)  # the save's, released
            hf_parts.set_aside_newer(run_dir, step)
            hf_layout.commit(built, step)
        hf_parts.barrier(t)
        if args.push_to_hub:
            t._push_from_checkpoint(str(final))
        best = t.state.best_model_checkpoint
        keep = self._sk_keep(run_dir, best)
        if args.should_save and keep is not None:
            hf_layout.rotate(run_dir, keep, [final, *([best] if best else [])])

    def _sk_note_best(self, run_dir: Path, step: int, final: Path) -> None:
        """``state.best_model_checkpoint`` as the Trainer sets it when it saves."""
        t: Any = self
        best_step = getattr(t.state, "best_global_step", None)
        strategy = getattr(t.args.save_strategy, "value", t.args.save_strategy)
        if not best_step or strategy not in ("steps", "epoch", "best"):
            return
        hf_parts.barrier(t)
        best = run_dir / f"{hf_layout.PREFIX}-{best_step}"
        if best_step == step or best.exists():
            t.state.best_model_checkpoint = str(best if best_step != step else final)

    def _sk_training_state(self) -> dict[str, Any]:
        t: Any = self
        entries: dict[str, Any] = {"rng": RNGState()}
        loader = hf_loader.entry(getattr(t.callback_handler, "train_dataloader", None))
        if loader is not None:
            entries["loader"] = loader
        entries |= {f"{EXTRA}{name}": obj for name, obj in self._sk_extra.items()}
        if t.optimizer is not None:
            entries["optimizer"] = named_state(t.optimizer, t.model)
        if t.lr_scheduler is not None:
            entries["scheduler"] = t.lr_scheduler.state_dict()
        scaler = getattr(t.accelerator, "scaler", None)
        if scaler is not None:
            entries["scaler"] = scaler.state_dict()
        return entries

    # ---- resume -------------------------------------------------------------------------

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

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; the folders the Trainer itself deletes at the end of a run
        (``save_total_limit=1`` with a best model) are renamed aside before their files go,
        so a kill then never leaves a half-deleted ``checkpoint-N`` for a resume to pick.
        ``resume_from_checkpoint=True`` with no ``checkpoint-N`` yet starts from scratch.
        First (main process; the others wait) a ``checkpoint-N`` that an overwrite killed
        between its two renames left set aside is put back, so the resume finds it."""
        import transformers.trainer as trainer_module

        resume = args[0] if args else kwargs.get("resume_from_checkpoint")
        t: Any = self
        if t.args.should_save:  # a checkpoint-N an overwrite set aside: back, before the
            hf_layout.put_back(t.args.output_dir)  # Trainer's get_last_checkpoint looks
        hf_parts.barrier(t)  # every rank resolves the resume after the main process did
        if resume is True and not hf_layout.checkpoints(t.args.output_dir):
            _log.info(
                "statekeeper: no checkpoint-N in %s to resume from: training from scratch",
                t.args.output_dir,
            )
            if args:
                args = (None, *args[1:])
            else:
                kwargs["resume_from_checkpoint"] = None
        with (
            hf_layout.safe_removal(trainer_module),
            hf_loader.resuming(trainer_module, self._sk_resume_loader),
        ):
            return super().train(*args, **kwargs)  # type: ignore[misc]


class StatekeeperTrainer(StatekeeperTrainerMixin, Trainer):
    """``transformers.Trainer`` whose checkpoints are statekeeper's (see the module)."""
