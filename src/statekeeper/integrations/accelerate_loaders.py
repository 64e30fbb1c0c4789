"""Accelerate's data loaders (``DataLoaderShard`` over torchdata's ``StatefulDataLoader``)
as state that resumes the exact order, within an epoch and across epochs.

Accelerate keeps two things outside the loader's own state: the epoch (its
``iteration``, which seeds the ``SeedableRandomSampler`` of ``use_seedable_sampler=True``
with ``initial_seed + epoch``) and the sampler's generator, made on its first pass. So a
loader is saved with its epoch, and restored by setting the epoch back (the next one when
the saved pass had ended), giving the sampler its generator when it has none yet, and
building the resumed iterator at once: it draws its seed from torch's global generator,
which the restore sets back afterwards, as it was when the run saved.

The loader's workers save their random state with their snapshots
(:func:`statekeeper.data.worker_rng.carry_worker_rng`, applied when the loader is first
seen); a save whose workers' snapshots hold none (workers started before that) warns.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from statekeeper.data.torchdata import UNRESUMABLE_SAMPLERS
from statekeeper.data.worker_rng import carry_worker_rng, workers_without_rng
from statekeeper.errors import InvalidArgumentError, StatekeeperWarning, user_stacklevel

__all__ = ["AccelerateLoader", "stateful_loaders", "unresumable_sampler"]


def _samplers(loader: Any) -> list[Any]:
    outer = getattr(loader, "batch_sampler", None)
    found = [
        getattr(outer, "sampler", None),
        getattr(getattr(outer, "batch_sampler", None), "sampler", None),
    ]
    return [s for s in found if s is not None]


def unresumable_sampler(loader: Any) -> str | None:
    """The name of the sampler of ``loader`` that draws a new order when made again
    (torch's ``RandomSampler``...), or None."""
    found = [type(s).__name__ for s in _samplers(loader) if type(s) in UNRESUMABLE_SAMPLERS]
    return found[0] if found else None


def _with_generator(loader: Any) -> None:
    """A seedable sampler that has not made its generator yet gets it now, as its first
    pass would (it reseeds it at every pass)."""
    for sampler in _samplers(loader):
        if hasattr(sampler, "initial_seed") and getattr(sampler, "generator", 1) is None:
            sampler.generator = torch.Generator().manual_seed(int(sampler.initial_seed))


class AccelerateLoader:
    """A prepared data loader of Accelerate's, as a ``state_dict`` / ``load_state_dict``
    object: its torchdata state and its epoch."""

    def __init__(self, name: str, loader: Any) -> None:
        self.name = name
        self.loader = loader
        # too late (its workers run already): state_dict's check of the snapshots warns
        carry_worker_rng(getattr(loader, "base_dataloader", loader))

    def state_dict(self) -> dict[str, Any]:
        sampler = unresumable_sampler(self.loader)
        if sampler is not None:
            raise InvalidArgumentError(
                f"data loader {self.name!r} shuffles with torch's {sampler}, which draws a new "
                "order when made again, so a resumed run would see other batches. Pass "
                "DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=True) "
                "to the Accelerator"
            )
        _with_generator(self.loader)
        own = self.loader.state_dict()
        missing = workers_without_rng(own)
        if missing:
            warnings.warn(
                f"statekeeper: data loader {self.name!r}: the snapshots of its workers "
                f"({', '.join(missing)}) hold no random state, because they started before "
                "statekeeper first saw the loader: random augmentation in __getitem__ would "
                "not resume exactly from this save. Call "
                "statekeeper.integrations.accelerate.has_checkpoint(accelerator) (or "
                "load_state) before the first batch, or wrap the dataset: "
                "DataLoader(statekeeper.data.WorkerRNGDataset(dataset), ...)",
                StatekeeperWarning,
                stacklevel=user_stacklevel(),
            )
        return {"loader": own, "epoch": int(self.loader.iteration)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _with_generator(self.loader)
        own = state["loader"]
        self.loader.load_state_dict(own)
        ended = bool(own.get("_iterator_finished", False))
        self.loader.set_epoch(int(state["epoch"]) + (1 if ended else 0))
        base = getattr(self.loader, "base_dataloader", None)
        if base is not None:
            base.state_dict()  # builds the resumed iterator now, before the RNG is restored


def stateful_loaders(accelerator: Any) -> list[Any]:
    """The prepared loaders that keep a position (Accelerate's own test for saving one)."""
    return [d for d in accelerator._dataloaders if getattr(d, "use_stateful_dataloader", False)]
