"""SK012: random augmentation in worker processes that a mid-epoch resume cannot reproduce.

Seen by running the dataset's own code: item 0 is fetched twice (the caller's RNG state is
kept) and compared. Different values mean ``__getitem__`` draws random numbers. With
``num_workers > 0`` those come from worker generators seeded once per epoch, which a resumed
epoch cannot put back (and its batches go to other workers), unless the dataset is a
``statekeeper.data.SeededDataset``, which seeds every item from (seed, epoch, index).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from statekeeper.data.seeding import SeededDataset
from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import NOTHING, DoctorRule
from statekeeper.doctor.rules._loaders import loaders
from statekeeper.state.compare import state_difference

__all__ = ["LoaderAugmentation"]


def _draws_random_numbers(dataset: Any) -> bool:
    try:
        with torch.random.fork_rng(devices=[]):
            a, b = dataset[0], dataset[0]
    except Exception:  # a dataset that cannot be probed is not reported
        return False
    return state_difference(a, b) is not None


class LoaderAugmentation(DoctorRule, id="SK012", severity=Severity.ERROR, needs=NOTHING):
    summary = "random augmentation in workers is not reproducible after a mid-epoch resume"

    def check(self, target: Target) -> Iterator[Finding]:
        for name, _, loader in loaders(target.state):
            dataset = loader.dataset
            if (
                loader.num_workers > 0
                and not isinstance(dataset, SeededDataset)
                and _draws_random_numbers(dataset)
            ):
                yield Finding(
                    self.id, Severity.ERROR, name,
                    f"{type(dataset).__name__}.__getitem__ returns different values for the same "
                    f"index and runs in {loader.num_workers} worker(s): a resumed epoch "
                    "augments its samples differently",
                    "wrap the dataset: statekeeper.data.SeededDataset(dataset, seed=...) with a "
                    "statekeeper.data.ResumableSampler",
                )  # fmt: skip
