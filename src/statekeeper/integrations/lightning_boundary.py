"""A Lightning checkpoint saved at an epoch's end, resumed as the next epoch's start.

Two checkpoints stand where an epoch ends: one saved by the epoch's last batch
(``every_n_train_steps`` landing on it) and one ``ModelCheckpoint`` saves as the epoch ends
(its default). Lightning (2.6) resumes neither exactly, with or without statekeeper:

- the first is counted one epoch too far on (its loops say "the last batch is done", and
  Lightning then also counts the next epoch as begun): a ``max_epochs`` run skips an epoch;
- for the second Lightning does not load the loader's saved position at all, so a
  shuffling loader draws the next epoch's order from its generator's first state: every
  resumed epoch replays epoch 0's order.

``StatekeeperCallback`` resumes both as what they are, the start of the next epoch: before
Lightning reads the loops (:func:`as_next_epoch`), it rewrites their progress to "epoch
``e`` done, no batch of ``e + 1`` begun" and keeps the loaders' saved positions for itself;
as that epoch starts (:func:`start_epoch`) it loads them (each loader's generator ends where
the saving run's stood), restores the RNG, and makes the epoch's iterator, which draws from
both as the saving run's did. Lightning's ``on_train_epoch_end`` hooks of the saved epoch
are not run again (a checkpoint saved by the last batch was saved before they ran).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["as_next_epoch", "start_epoch"]

_LOADERS = "combined_loader"


def _progress(fit: dict[str, Any], key: str) -> dict[str, Any] | None:
    found = fit.get(key)
    return found if isinstance(found, dict) and isinstance(found.get("total"), dict) else None


def _settle(progress: Any) -> None:
    """Every tracker in ``progress`` as a finished run leaves it: ``current`` counts at 0,
    ``total`` counts all at the furthest one done."""
    if not isinstance(progress, dict):
        return
    if isinstance(progress.get("total"), dict) and isinstance(progress.get("current"), dict):
        done = max(int(v) for v in progress["total"].values())
        progress["total"] = dict.fromkeys(progress["total"], done)
        progress["current"] = dict.fromkeys(progress["current"], 0)
        return
    for value in progress.values():
        _settle(value)


def as_next_epoch(checkpoint: dict[str, Any]) -> list[Any] | None:
    """When ``checkpoint`` was saved with every batch of its epoch done, rewrite its loops
    to the start of the next epoch and return the loaders' saved positions (taken out of
    it, an empty list when it held none); None (the checkpoint untouched) otherwise."""
    fit = checkpoint.get("loops", {}).get("fit_loop")
    if not isinstance(fit, dict):
        return None
    batches, epochs = _progress(fit, "epoch_loop.batch_progress"), _progress(fit, "epoch_progress")
    if batches is None or epochs is None or not batches.get("is_last_batch"):
        return None
    if int(batches["current"].get("processed", 0)) == 0:
        return None
    ended = int(epochs["total"]["started"])  # epochs begun: the one that ended is the last
    for part in ("total", "current"):
        epochs[part] = dict.fromkeys(epochs[part], ended)
    done = int(batches["total"]["processed"])
    batches["total"] = dict.fromkeys(batches["total"], done)
    batches["current"] = dict.fromkeys(batches["current"], 0)
    batches["is_last_batch"] = False
    for key, value in fit.items():  # the optimizers', the schedulers', validation's counters
        if key.startswith("epoch_loop.") and key.endswith("progress") and value is not batches:
            _settle(value)
    state = fit.get("state_dict")
    loaders: list[Any] = []
    if isinstance(state, dict) and isinstance(state.get(_LOADERS), list):
        loaders, state[_LOADERS] = state[_LOADERS], []
    return loaders


def start_epoch(trainer: Any, loaders: list[Any], restore_rng: Callable[[], None]) -> None:
    """On the first ``on_train_epoch_start`` after :func:`as_next_epoch`: put each training
    loader where the saving run's stood, restore the RNG, then make the epoch's iterator."""
    fit = trainer.fit_loop
    combined = getattr(fit, "_combined_loader", None)
    fetcher = getattr(fit, "_data_fetcher", None)
    if loaders and combined is not None and callable(getattr(combined, "_load_state_dicts", None)):
        combined._load_state_dicts(loaders)
        for loader in combined.flattened:
            if getattr(loader, "next_iter_state", None) is not None:
                iter(loader)  # the saved epoch's spent iterator: its generators are replayed
    restore_rng()
    if fetcher is not None:
        iter(fetcher)  # the new epoch's iterator, drawn as the saving run drew it
