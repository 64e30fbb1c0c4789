"""Exact resume for torchdata's ``StatefulDataLoader``: what its own state_dict misses.

Measured with torchdata 0.11: a ``StatefulDataLoader(shuffle=True, generator=g)`` restored
from its own ``state_dict()`` continues the current epoch correctly, but shuffles every later
epoch differently. Building an iterator draws the base seed from ``g`` after the epoch's
permutation; the restore replays the permutation but not that draw, so ``g`` ends up one
draw behind. And building the resumed iterator at all draws from the global generator.

statekeeper stores, next to the loader's own state, the *current* states of the loader's
and the sampler's generators, and restores in this order: ``load_state_dict``; build the
resumed iterator now (through the loader's public ``state_dict()``, which hands exactly
that iterator to the next ``iter(loader)``); set the generators to their saved states; and,
last of all (in ``load``), the global RNG.

Samplers whose iterators keep no state and draw a fresh permutation when re-created
(``torch.utils.data.RandomSampler``, ``SubsetRandomSampler``, ``WeightedRandomSampler``)
cannot resume the same order: saving such a loader is refused with the fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from statekeeper.errors import (
    CheckpointUnreadableError,
    InvalidArgumentError,
    StatekeeperWarning,
    user_stacklevel,
)

__all__ = [
    "UNRESUMABLE_SAMPLERS",
    "capture_loader",
    "loader_generator_list",
    "is_stateful_dataloader",
    "refuse_plain_dataloader",
    "restore_loader",
]

_MARK = "statekeeper_loader"
UNRESUMABLE_SAMPLERS = (
    torch.utils.data.RandomSampler,
    torch.utils.data.SubsetRandomSampler,
    torch.utils.data.WeightedRandomSampler,
)


def is_stateful_dataloader(obj: object) -> bool:
    return (  # one hasattr, no generator, for the objects that are not (every entry saved)
        hasattr(obj, "next_iter_state")
        and hasattr(obj, "_get_iterator")
        and hasattr(obj, "_initial_iter_for_state_dict")
    )


def _sampler(loader: Any) -> Any:
    batch_sampler = getattr(loader, "batch_sampler", None)
    return getattr(batch_sampler, "sampler", None) or getattr(loader, "sampler", None)


def _generators(loader: Any) -> dict[str, torch.Generator | None]:
    own = getattr(loader, "generator", None)
    sampler_gen = getattr(_sampler(loader), "generator", None)
    return {
        "loader": own if isinstance(own, torch.Generator) else None,
        "sampler": sampler_gen
        if isinstance(sampler_gen, torch.Generator) and sampler_gen is not own
        else None,
    }


def loader_generator_list(loader: Any) -> list[torch.Generator]:
    """The generators a StatefulDataLoader saves with itself (its own, its sampler's)."""
    return [g for g in _generators(loader).values() if g is not None]


def refuse_plain_dataloader(name: str, obj: object) -> None:
    """A plain DataLoader has no position to save: say how to get one."""
    if isinstance(obj, torch.utils.data.DataLoader) and not is_stateful_dataloader(obj):
        raise InvalidArgumentError(
            f"state entry {name!r} is a torch.utils.data.DataLoader, which has no state: a resumed "
            "run would start its epoch over. Wrap it: "
            "statekeeper.data.ResumableLoader(DataLoader(..., "
            "sampler=statekeeper.data.ResumableSampler(dataset, seed=...))), or use torchdata's "
            "StatefulDataLoader."
        )


def _carries_worker_rng(loader: Any) -> bool:
    """Whether the workers' random state is saved with the loader (torchdata snapshots a
    Stateful dataset per worker), or items do not depend on it (per-sample seeding)."""
    from statekeeper.data.seeding import SeededDataset
    from statekeeper.data.worker_rng import carries_worker_rng

    dataset = getattr(loader, "dataset", None)
    if carries_worker_rng(loader):
        return True
    if isinstance(dataset, SeededDataset | torch.utils.data.IterableDataset):
        return True  # iterable datasets carry their own state (Stateful or not resumable)
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


def _warn_worker_randomness(name: str, loader: Any) -> None:
    """Never silent: a loader whose workers' random draws cannot be resumed says so at save."""
    workers = getattr(loader, "num_workers", 0)
    if workers and not _carries_worker_rng(loader):
        warnings.warn(
            f"statekeeper: state entry {name!r} is a StatefulDataLoader with "
            f"num_workers={workers}: random numbers its workers draw in __getitem__ (random "
            "augmentation) are not saved, so a run resumed mid-epoch would augment the same "
            "samples differently. If the dataset draws random numbers, wrap it: "
            "StatefulDataLoader(statekeeper.data.WorkerRNGDataset(dataset), ...); if it does not, "
            "ignore this warning.",
            StatekeeperWarning,
            stacklevel=user_stacklevel(),
        )


def capture_loader(name: str, loader: Any) -> dict[str, Any]:
    """The loader's own state plus its generators' current states; refuses what cannot resume."""
    sampler = _sampler(loader)
    if type(sampler) in UNRESUMABLE_SAMPLERS:
        raise InvalidArgumentError(
            f"state entry {name!r}: a StatefulDataLoader sampling with torch's "
            f"{type(sampler).__name__} cannot resume the same order (the sampler draws a new "
            "permutation when re-created). Use shuffle=True with generator=..., torchdata's "
            "stateful_dataloader.sampler.RandomSampler, or statekeeper.data.ResumableSampler."
        )
    _warn_worker_randomness(name, loader)
    own = loader.state_dict()  # first: before the first iter() this builds the iterator (draws)
    generators = {
        role: (None if g is None else g.get_state()) for role, g in _generators(loader).items()
    }
    return {_MARK: 1, "loader": own, "generators": generators}


def restore_loader(name: str, loader: Any, saved: Mapping[str, Any]) -> None:
    """Load, build the resumed iterator now, then put the generators where they were.
    ``name`` is the state entry (for the errors)."""
    if not (
        isinstance(saved, Mapping)
        and saved.get(_MARK) == 1
        and isinstance(saved.get("generators"), Mapping)
        and "loader" in saved
    ):
        raise CheckpointUnreadableError(
            f"state entry {name!r}: the checkpoint holds no statekeeper data-loader state "
            f"there (found {type(saved).__name__}): load it into the object it was saved from "
            "(a StatefulDataLoader saved under this key), or drop the loader from the state "
            "to start its epoch over"
        )
    generators = _generators(loader)
    for role, gen in generators.items():  # checked before anything is loaded
        if (gen is None) != (saved["generators"].get(role) is None):
            saver, this = ("had a", "has none") if gen is None else ("had no", "has one")
            raise InvalidArgumentError(
                f"state entry {name!r}: the loader that saved {saver} {role} generator, this one "
                f"{this}: build the loader as the saving run did ({role} generator "
                f"{'given' if gen is None else 'left out'}), so that its order resumes"
            )
    loader.load_state_dict(saved["loader"])
    if loader.next_iter_state is not None:
        loader.state_dict()  # builds the resumed iterator; the next iter(loader) returns it
    for role, gen in generators.items():
        if gen is not None:
            gen.set_state(saved["generators"][role])
