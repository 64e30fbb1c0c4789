"""Random augmentation in DataLoader workers resumes exactly mid-epoch, or the save says so.

A ``StatefulDataLoader(shuffle=True, generator=g, num_workers=N)`` over a dataset that draws
random numbers in ``__getitem__`` is stopped at several points (mid-epoch in the first and
the second epoch), saved with statekeeper, rebuilt from scratch, loaded and run on; the
batches must equal an uninterrupted run's, for 0, 1, 2 and 4 workers with
``persistent_workers`` on and off.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import statekeeper as sk

SAMPLES, BATCH, EPOCHS = 24, 4, 2  # 6 batches an epoch
KILLS = (2, 5, 9)  # mid-epoch 1, the last batch of epoch 1, mid-epoch 2


class Augmented(torch.utils.data.Dataset[torch.Tensor]):
    """Each item draws from torch's, numpy's and Python's RNG, as augmentations do."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        noise = torch.rand(2).sum() + float(np.random.rand()) + random.random()
        return torch.tensor([float(index), float(noise)], dtype=torch.float64)


def _loader(workers: int, persistent: bool, wrapped: bool) -> StatefulDataLoader:
    data: Any = Augmented()
    if wrapped:
        data = sk.data.WorkerRNGDataset(data)
    return StatefulDataLoader(
        data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(7),
        num_workers=workers, persistent_workers=persistent and workers > 0,
        multiprocessing_context="fork" if workers else None,
    )  # fmt: skip


def _batches(loader: StatefulDataLoader, count: int, it: Any = None) -> tuple[list[Any], Any]:
    out: list[Any] = []
    while len(out) < count:
        if it is None:
            it = iter(loader)
        try:
            out.append(next(it))
        except StopIteration:
            it = None
    return out, it


def _seed() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


CONFIGS = [(w, p) for w in (0, 1, 2, 4) for p in (False, True) if w or not p]


@pytest.mark.parametrize(("workers", "persistent"), CONFIGS)
def test_worker_randomness_resumes_exactly_at_every_kill_point(
    tmp_path: Path, workers: int, persistent: bool
) -> None:
    total = EPOCHS * SAMPLES // BATCH
    _seed()
    reference, _ = _batches(_loader(workers, persistent, wrapped=True), total)
    for kill in KILLS:
        _seed()
        loader = _loader(workers, persistent, wrapped=True)
        _, it = _batches(loader, kill)
        with warnings.catch_warnings():
            warnings.simplefilter("error", sk.StatekeeperWarning)  # nothing to warn about
            sk.save(tmp_path / f"k{kill}", {"loader": loader, "rng": sk.RNGState()}, step=kill)
        del it, loader
        _seed()  # the new process starts elsewhere; load must put everything back
        torch.manual_seed(123)
        fresh = _loader(workers, persistent, wrapped=True)
        sk.load(tmp_path / f"k{kill}", {"loader": fresh, "rng": sk.RNGState()})
        rest, _ = _batches(fresh, total - kill)
        for i, (a, b) in enumerate(zip(reference[kill:], rest, strict=True)):
            assert torch.equal(a, b), f"kill at {kill}: batch {kill + i} differs"


@pytest.mark.parametrize("workers", [1, 2])
def test_unwrapped_worker_randomness_is_never_silent(tmp_path: Path, workers: int) -> None:
    loader = _loader(workers, persistent=False, wrapped=False)
    _batches(loader, 2)
    with pytest.warns(sk.StatekeeperWarning, match="WorkerRNGDataset") as caught:
        sk.save(tmp_path, {"loader": loader}, step=1)
    assert caught[0].filename == __file__  # the user's line, not statekeeper's


def test_the_main_process_needs_no_wrapper(tmp_path: Path) -> None:
    total = EPOCHS * SAMPLES // BATCH
    _seed()
    reference, _ = _batches(_loader(0, False, wrapped=False), total)
    _seed()
    loader = _loader(0, False, wrapped=False)
    _batches(loader, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sk.StatekeeperWarning)
        sk.save(tmp_path, {"loader": loader, "rng": sk.RNGState()}, step=3)
    torch.manual_seed(99)
    fresh = _loader(0, False, wrapped=False)
    sk.load(tmp_path, {"loader": fresh, "rng": sk.RNGState()})
    rest, _ = _batches(fresh, total - 3)
    assert all(torch.equal(a, b) for a, b in zip(reference[3:], rest, strict=True))
