"""Per-sample seeding: augmentation randomness that a resumed epoch reproduces.

Random augmentation in ``Dataset.__getitem__`` draws from the RNG of whichever process runs
it: the main process (``num_workers=0``) or a worker seeded once per epoch. A run resumed
mid-epoch cannot put a worker's generator back where it was, and the next batches go to
other workers anyway. :class:`SeededDataset` removes the dependency: before each
``__getitem__`` it seeds Python's ``random``, numpy's global generator and torch's CPU
generator from ``(seed, epoch, index)``, and afterwards restores what they held, so the
training loop's own random stream is untouched (CUDA generators are never touched). The
epoch comes from the :class:`~statekeeper.data.sampler.SampleIndex` a ``ResumableSampler``
yields (0 for a plain int index).
"""

from __future__ import annotations

import random
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from statekeeper.data.sampler import epoch_seed

__all__ = ["SeededDataset"]

T = TypeVar("T")


class SeededDataset(torch.utils.data.Dataset[T], Generic[T]):
    """``dataset`` whose items are drawn with RNGs seeded from (seed, epoch, index).

    Args:
        dataset: The map-style dataset to wrap.
        seed: The seed every item's RNGs derive from, with the epoch and the index.
    """

    def __init__(self, dataset: torch.utils.data.Dataset[T], seed: int = 0) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> T:
        seed = epoch_seed(self.seed, getattr(index, "epoch", 0), int(index))
        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.default_generator.manual_seed(seed)  # CPU only: CUDA streams are left alone
        try:
            return self.dataset[index]
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])
