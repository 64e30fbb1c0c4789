"""How ``StatekeeperTrainer`` saves a ``checkpoint-N`` (:mod:`.transformers`): the folder built
as ``checkpoint-N.partial`` (the model as ``save_pretrained`` writes it, ``trainer_state.json``,
the arguments as JSON), the training state (the optimizer by parameter name, the scheduler,
the scaler, every RNG, the loader's position, ``extra_state``) one statekeeper step in it
that records every file's checksum, flushed, committed by its rename, then rotated by step
number."""

from __future__ import annotations

from concurrent.futures import wait
from pathlib import Path
from typing import Any

from statekeeper.checkpoint.retention_policies import KeepLatest, Retention
from statekeeper.checkpoint.save import save
from statekeeper.checkpoint.scope import Scope
from statekeeper.integrations import hf_layout, hf_loader, hf_parts
from statekeeper.integrations.held import named_state
from statekeeper.integrations.hf_resume import EXTRA
from statekeeper.lanes import lane
from statekeeper.state.rng import RNGState

__all__ = ["CheckpointSaving"]


class CheckpointSaving:
    """The Trainer's ``_save_checkpoint``, for :class:`.transformers.StatekeeperTrainerMixin`
    (which sets ``_sk_retention`` and ``_sk_extra``)."""

    _sk_retention: Retention | None
    _sk_extra: dict[str, Any]

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
        pool = lane("flush")  # long-lived: a thread ending at a fork can hang the child
        flushed = (
            pool.submit(hf_layout.flush, built, entries["files"]) if args.should_save else None
        )
        try:
            save(built, entries, step=step, scope=Scope.AUTO)
        except BaseException:
            if flushed is not None:
                wait([flushed])  # done with the files before the save's error goes up
            raise
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
