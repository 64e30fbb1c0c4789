"""Reading one ``checkpoint-N`` back for the transformers ``Trainer`` integration: every
byte of its statekeeper step and every other file of the folder verified at once, then
handed to the Trainer piece by piece as it asks (optimizer and scheduler, scaler, then the
RNG once the data iterator stands where the saving run's stood), each piece dropped once
applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from statekeeper.checkpoint.load import Strict, load
from statekeeper.errors import CorruptCheckpointError
from statekeeper.integrations import hf_layout
from statekeeper.integrations.held import DeferredRNG

__all__ = ["ARGS_JSON", "LoadedCheckpoint", "ours", "verify_folder"]

ARGS_JSON = "training_args.json"  # written by the integration, never by the plain Trainer


def _has_step(path: Path) -> bool:
    return any(p.name.startswith("step_") and p.is_dir() for p in path.iterdir())


def ours(folder: str | Path) -> bool:
    """Whether ``folder`` was saved through statekeeper (else the plain Trainer saved it,
    and the Trainer's own code reads it). A folder of ours that lost its step is damaged:
    ``CorruptCheckpointError``, never a silent resume without the optimizer."""
    path = Path(folder)
    if not path.is_dir():
        return False
    if _has_step(path):
        return True
    if (path / ARGS_JSON).is_file():
        raise CorruptCheckpointError(
            str(path),
            "holds no statekeeper step (step_*) although StatekeeperTrainer saved it (it has "
            f"{ARGS_JSON}): it was partly deleted or damaged; resume from another "
            "checkpoint-N (resume_from_checkpoint=<its path>)",
        )
    return False


def verify_folder(folder: Path) -> None:
    """Check the folder's files against the checksums its step recorded (reads the step's
    small entries only when nothing else is asked)."""
    files: dict[str, Any] = {}
    load(folder, {"files": files}, strict=Strict.ALLOW_UNEXPECTED)
    hf_layout.verify_files(folder, files)


class LoadedCheckpoint:
    """The verified contents of one ``checkpoint-N``; ``take`` hands each piece out once."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rng = DeferredRNG()
        self.state: dict[str, Any] = {
            "optimizer": {},
            "scheduler": {},
            "scaler": {},
            "files": {},
            "rng": self.rng,
        }
        # every byte of the step is verified before anything is assigned; then the
        # folder's other files against the checksums the step recorded
        load(folder, self.state, strict=Strict.ALLOW_MISSING)
        hf_layout.verify_files(folder, self.state.pop("files"))

    def take(self, name: str) -> Any:
        """The saved state of ``name`` (``optimizer``, ``scheduler``, ``scaler``), once: the
        copy is not kept after it is applied (None when absent or taken)."""
        value = self.state.pop(name, None)
        return value or None

    def restore_rng(self) -> None:
        """Set the generators to the saved states, once."""
        self.rng.apply()
        self.rng.saved = None
        self.state.pop("rng", None)
