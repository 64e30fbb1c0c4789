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
from collections.abc import Mapping
from typing import Any

from transformers import Trainer

from statekeeper.checkpoint.retention_policies import Retention
from statekeeper.errors import InvalidArgumentError
from statekeeper.integrations import hf_layout, hf_loader, hf_parts
from statekeeper.integrations.hf_restore import CheckpointLoading
from statekeeper.integrations.hf_resume import LoadedCheckpoint, checked_extra
from statekeeper.integrations.hf_save import CheckpointSaving

__all__ = ["StatekeeperTrainer", "StatekeeperTrainerMixin"]

_log = logging.getLogger(__name__)


class StatekeeperTrainerMixin(CheckpointSaving, CheckpointLoading):
    """Put before ``transformers.Trainer`` in a subclass's bases (see the module docstring).

    ``retention`` (keyword, optional): the statekeeper ``Retention`` policy for the
    ``checkpoint-N`` folders; default ``KeepLatest(args.save_total_limit)``, or keep all.
    ``extra_state`` (keyword, optional): objects of your own with ``state_dict()`` and
    ``load_state_dict()`` by name (``{"ema": ema}``), saved in every step (rank 0's; wrap
    one that differs between ranks in ``statekeeper.distributed.PerRank``) and restored in place on
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
