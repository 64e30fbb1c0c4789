"""Reading one ``checkpoint-N`` back for the transformers ``Trainer`` integration: every
byte of its statekeeper step and every other file of the folder verified at once, then
handed to the Trainer piece by piece as it asks (optimizer and scheduler, scaler, then the
RNG once the data iterator stands where the saving run's stood), each piece dropped once
applied."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from statekeeper.catalog.location import locate
from statekeeper.catalog.manifests import read_manifest
from statekeeper.checkpoint.load import Strict, load
from statekeeper.distributed.per_rank import PerRank
from statekeeper.errors import CorruptCheckpointError, InvalidArgumentError, KeyMismatchError
from statekeeper.integrations import hf_layout, hf_loader
from statekeeper.integrations.held import DeferredRNG
from statekeeper.stateful import is_stateful

__all__ = ["ARGS_JSON", "EXTRA", "LoadedCheckpoint", "checked_extra", "ours", "verify_folder"]

ARGS_JSON = "training_args.json"  # written by the integration, never by the plain Trainer
EXTRA = "extra."  # the entries of extra_state=: extra.<name>


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
    """The verified contents of one ``checkpoint-N``; ``take`` hands each piece out once.
    The objects of ``extra`` (``extra_state=``) are restored in place here."""

    def __init__(self, folder: Path, extra: Mapping[str, Any] | None = None) -> None:
        self.folder = folder
        self.rng = DeferredRNG()
        self.rng_early = False  # restored before the first batch: the Trainer's call skips
        self.loader = hf_loader.Held()
        self.state: dict[str, Any] = {
            "optimizer": {},
            "scheduler": {},
            "scaler": {},
            "files": {},
            "rng": self.rng,
            "loader": PerRank(self.loader),
        }
        extras = {f"{EXTRA}{k}": v for k, v in (extra or {}).items()}
        _check_extra(folder, set(extras))
        # every byte of the step is verified before anything is assigned (the extra
        # objects, restored in place, included); then the folder's other files against
        # the checksums the step recorded
        load(folder, {**self.state, **extras}, strict=Strict.ALLOW_MISSING)
        hf_layout.verify_files(folder, self.state.pop("files"))
        self.state.pop("loader")

    def take(self, name: str) -> Any:
        """The saved state of ``name`` (``optimizer``, ``scheduler``, ``scaler``), once: the
        copy is not kept after it is applied (None when absent or taken)."""
        value = self.state.pop(name, None)
        return value or None

    def take_loader(self) -> dict[str, Any] | None:
        """The training loader's saved state (this rank's), once (None when absent)."""
        saved, self.loader.saved = self.loader.saved, None
        return saved

    def restore_rng(self) -> None:
        """Set the generators to the saved states, once."""
        self.rng.apply()
        self.rng.saved = None
        self.state.pop("rng", None)


def _check_extra(folder: Path, given: set[str]) -> None:
    """The extra_state given and the one saved name the same objects."""
    manifest = read_manifest(locate(folder, None))
    state = manifest.state if isinstance(manifest.state, Mapping) else {}
    saved = {k for k in state if k.startswith(EXTRA)}
    if saved == given:
        return
    problems = [f"{k[len(EXTRA) :]!r}: missing from the checkpoint" for k in sorted(given - saved)]
    problems += [f"{k[len(EXTRA) :]!r}: saved, not given" for k in sorted(saved - given)]
    raise KeyMismatchError(
        [f"{folder} extra_state {p}" for p in problems],
        "pass StatekeeperTrainer(extra_state=...) the objects this checkpoint-N was saved with "
        "(the same names), or resume from a checkpoint-N saved with these",
    )


def checked_extra(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """``extra_state=`` validated: names that are identifiers, objects with state."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise InvalidArgumentError(
            f"extra_state must be a mapping of names to objects, got {type(extra).__name__}: "
            'pass extra_state={"ema": ema}'
        )
    for name, obj in extra.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise InvalidArgumentError(
                f"extra_state name {name!r} must be a Python identifier (letters, digits, _)"
            )
        if not is_stateful(obj):
            raise InvalidArgumentError(
                f"extra_state[{name!r}] is a {type(obj).__name__}, which has no state_dict() / "
                "load_state_dict(): pass such an object (an sk.averaging.AveragedModel, a module, "
                "a callback with both methods), or wrap a plain value in statekeeper.Value"
            )
    return dict(extra)
