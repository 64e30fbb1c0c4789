"""A Lightning run resumed mid-epoch, drawn in the order the run that saved drew it.

Lightning (2.5.3 and later, issue Lightning-AI/pytorch-lightning#21938) makes the training
iterator in ``FitLoop.setup_data`` before it sets the sampler's epoch, and keeps that
iterator on a resume: resumed mid-epoch, the rest of the epoch is drawn from epoch 0's
permutation of its ``DistributedSampler`` (the loader's position is right, the order is
another epoch's), with or without statekeeper.

``StatekeeperCallback`` repairs it: the sampler's epoch set to the resumed one, the
loader's saved position loaded again, the iterator made anew; the RNG is restored after,
before the first batch is fetched, as the saving run's stood. Only Lightning's
own loop attributes are used, and only when they are there (on a Lightning without them
nothing is done).

Not repaired (docs/integrations.md): a sampler that draws from the global RNG as its
iterator is made (Lightning's ``DistributedSamplerWrapper`` around a torchdata
``StatefulDataLoader``'s shuffling sampler), and a checkpoint saved by the last batch of
an epoch (or, in a run bounded by ``max_steps``, as an epoch ended), which Lightning
resumes an epoch further on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["loader_states", "resumed_mid_epoch"]


def loader_states(checkpoint: dict[str, Any]) -> list[Any] | None:
    """The training loaders' saved positions in a Lightning checkpoint (a ``state_dict``
    per ``StatefulDataLoader``), or None when it holds none."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    states = fit.get("state_dict", {}).get("combined_loader") if isinstance(fit, dict) else None
    return states if isinstance(states, list) and states else None


def _samplers(trainer: Any) -> Iterator[Any]:
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    for loader in getattr(combined, "flattened", None) or ():
        found = {}
        for sampler in (
            getattr(loader, "sampler", None),
            getattr(getattr(loader, "batch_sampler", None), "sampler", None),
        ):
            if callable(getattr(sampler, "set_epoch", None)):
                found[id(sampler)] = sampler
        yield from found.values()


def _epoch(trainer: Any) -> int:
    return int(trainer.fit_loop.epoch_progress.current.processed)


def _remake(trainer: Any, states: list[Any] | None) -> bool:
    fit = trainer.fit_loop
    combined = getattr(fit, "_combined_loader", None)
    fetcher = getattr(fit, "_data_fetcher", None)
    if combined is None or fetcher is None:
        return False
    if states is not None:
        if not callable(getattr(combined, "_load_state_dicts", None)):
            return False
        combined._load_state_dicts(states)
    iter(fetcher)
    return True


def resumed_mid_epoch(trainer: Any, states: list[Any] | None) -> bool:
    """On ``on_train_start`` of a resumed run: when a sampler's epoch is not the resumed
    epoch, set it, load the loaders' saved positions again, and make the iterator anew.
    Whether anything was done."""
    epoch = _epoch(trainer)
    stale = [s for s in _samplers(trainer) if getattr(s, "epoch", epoch) != epoch]
    ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    total = getattr(trainer, "num_training_batches", float("inf"))
    if not stale or ready == 0 or ready >= total:
        return False  # not mid-epoch: Lightning makes the next epoch's iterator itself
    for sampler in stale:
        sampler.set_epoch(epoch)
    return _remake(trainer, states)
