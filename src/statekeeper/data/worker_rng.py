"""Random augmentation in DataLoader workers that a mid-epoch resume reproduces exactly.

A ``Dataset.__getitem__`` that draws random numbers (random crops, flips, noise) draws from
the global RNGs of whichever process runs it: with ``num_workers > 0``, a worker process
seeded when it starts. torchdata's ``StatefulDataLoader`` resumes the *order* of the samples
exactly, but it does not know about those generators, so a run resumed mid-epoch hands the
same samples other augmentations and silently diverges.

:class:`WorkerRNGDataset` carries them through torchdata's own per-worker snapshot: it is a
``Stateful`` dataset whose state is the RNG state of the process it runs in (Python's
``random``, numpy's global generator and torch's CPU generator). ``StatefulDataLoader``
snapshots each worker's dataset state together with the batches that worker produced, and
on resume restores it in the new worker before the first item is drawn, so every worker
continues its random stream where the saved run left it (``persistent_workers`` on or off).
In the main process (``num_workers=0``) it holds the main process's generators, which
statekeeper restores anyway (the ``Checkpointer``'s RNG entry, restored last).
"""

from __future__ import annotations

import random
from typing import Any, Generic, TypeVar

import numpy as np
import torch

__all__ = ["WorkerRNGDataset"]

T = TypeVar("T")


class WorkerRNGDataset(torch.utils.data.Dataset[T], Generic[T]):
    """``dataset``, with the random state of the process that draws its items saved and
    restored by ``StatefulDataLoader`` (see the module docstring)."""

    def __init__(self, dataset: torch.utils.data.Dataset[T]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> T:
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:  # the wrapped dataset's own attributes
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def state_dict(self) -> dict[str, Any]:
        return {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        python = state["python"]
        random.setstate((python[0], tuple(python[1]), python[2]))
        np.random.set_state(tuple(state["numpy"]))
        torch.set_rng_state(state["torch"])
