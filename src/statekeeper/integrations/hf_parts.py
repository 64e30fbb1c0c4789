"""Small pieces of the transformers ``Trainer`` integration's save (:mod:`.transformers`):
the training arguments as JSON, the callbacks' exported state, a barrier, and the folders
of newer steps set aside with a warning."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from statekeeper.errors import StatekeeperWarning
from statekeeper.integrations import hf_layout
from statekeeper.integrations.hf_resume import ARGS_JSON

__all__ = ["args_as_json", "barrier", "export_callback_state", "sagemaker_mp", "set_aside_newer"]

_ARGS_BIN = "training_args.bin"  # pickled by Trainer._save: replaced by JSON


def sagemaker_mp() -> bool:
    from transformers.utils.import_utils import is_sagemaker_mp_enabled

    return bool(is_sagemaker_mp_enabled())


def set_aside_newer(run_dir: Path, step: int) -> None:
    moved = hf_layout.set_aside_newer(run_dir, step)
    if moved:
        warnings.warn(
            f"statekeeper: {run_dir} held checkpoint folders newer than this run's step "
            f"{step} (a run this one rolled back from, or an older run): renamed aside as "
            f"{', '.join(p.name for p in moved)} so that a resume cannot jump onto them; "
            "delete them when they are not needed",
            StatekeeperWarning,
            stacklevel=4,
        )


def barrier(trainer: Any) -> None:
    if trainer.args.world_size > 1:
        trainer.accelerator.wait_for_everyone()


def args_as_json(trainer: Any, folder: Path) -> None:
    """The training arguments as JSON in place of the pickled ``training_args.bin``."""
    (folder / _ARGS_BIN).unlink(missing_ok=True)
    (folder / ARGS_JSON).write_text(trainer.args.to_json_string() + "\n")


def export_callback_state(trainer: Any) -> None:
    """Record the stateful callbacks' state in ``trainer.state``, as the Trainer's own
    save does before it writes ``trainer_state.json``."""
    from transformers.trainer_callback import ExportableState

    for cb in [*trainer.callback_handler.callbacks, trainer.control]:
        if not isinstance(cb, ExportableState):
            continue
        name = type(cb).__name__
        slot = trainer.state.stateful_callbacks.get(name)
        if isinstance(slot, list):
            slot.append(cb.state())
        else:
            trainer.state.stateful_callbacks[name] = cb.state()
