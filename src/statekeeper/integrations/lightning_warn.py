"""What ``StatekeeperCallback`` cannot make exact in a Lightning run, said at fit start.

Checked on the training loaders once Lightning has made them (``on_train_start``), each a
``StatekeeperWarning`` naming the setting to change:

- a loader with worker processes over a dataset that keeps no per-worker state: random
  numbers its ``__getitem__`` draws (augmentation) are not saved, so a run resumed
  mid-epoch augments the same samples otherwise (a resume from an epoch's end is exact:
  the workers are seeded anew, as in the saving run). The fix is one line:
  ``StatefulDataLoader(statekeeper.data.WorkerRNGDataset(dataset), ...)`` (in a multi-process
  run each rank's own is saved and restored: :mod:`.lightning_ranks`);
- in a multi-process run, a shuffling ``StatefulDataLoader`` that Lightning wraps in its
  ``DistributedSamplerWrapper``, which draws each epoch's order from the global RNG as the
  iterator is made: a run resumed mid-epoch draws another order. The fix:
  ``use_distributed_sampler=False`` and torchdata's ``StatefulDistributedSampler``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from statekeeper.errors import StatekeeperWarning, user_stacklevel

__all__ = ["warn_inexact"]


def _loaders(trainer: Any) -> Iterator[Any]:
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    yield from getattr(combined, "flattened", None) or ()


def _keeps_worker_state(dataset: Any) -> bool:
    from statekeeper.data.seeding import SeededDataset

    if isinstance(dataset, SeededDataset):
        return True
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


def _shuffling_wrapper(loader: Any) -> bool:
    sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None) or getattr(
        loader, "sampler", None
    )
    if type(sampler).__name__ != "DistributedSamplerWrapper":
        return False
    inner = getattr(getattr(sampler, "dataset", None), "_sampler", None)
    return "Sequential" not in type(inner).__name__


def _warn(message: str) -> None:
    warnings.warn(f"statekeeper: {message}", StatekeeperWarning, stacklevel=user_stacklevel())


def warn_inexact(trainer: Any) -> None:
    """Warn about every training loader whose resume cannot be exact (module docstring)."""
    ranks = int(getattr(trainer, "world_size", 1))
    for loader in _loaders(trainer):
        workers = int(getattr(loader, "num_workers", 0) or 0)
        stateful = _keeps_worker_state(getattr(loader, "dataset", None))
        if workers and not stateful:
            _warn(
                f"the training loader has num_workers={workers} and its dataset saves no "
                "per-worker state: random numbers drawn in __getitem__ (augmentation) are not "
                "saved, and a run resumed mid-epoch augments the same samples otherwise. If "
                "the dataset draws random numbers, wrap it: "
                "StatefulDataLoader(statekeeper.data.WorkerRNGDataset(dataset), ...)"
            )
        if ranks > 1 and _shuffling_wrapper(loader):
            _warn(
                "Lightning wraps the shuffling training loader's sampler in its "
                "DistributedSamplerWrapper, which draws each epoch's order from the global RNG: "
                "a run resumed mid-epoch trains on another order. Use "
                "StatefulDataLoader(dataset, sampler=torchdata.stateful_dataloader.sampler."
                "StatefulDistributedSampler(dataset, shuffle=True, seed=...)) with "
                "Trainer(use_distributed_sampler=False)"
            )
