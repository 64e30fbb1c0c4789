"""Record batch sequences of loader setups, and resume them, in this process.

Usage: python -m tests.helpers.loader_order MODE DIR WORKERS
MODE "save": for every stop position k of a 3-epoch run, build the loader, take k batches,
save its state to DIR/k; print the uninterrupted sequence per setup as JSON.
MODE "resume": for every k, build a fresh loader, load DIR/k, take the remaining batches;
print the resumed sequences as JSON.
"""

from __future__ import annotations

import json
import random
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler as TorchdataRandomSampler

import statekeeper as sk

N, BATCH, EPOCHS = 22, 4, 3  # 22 is not a multiple of 4: each epoch ends on a short batch
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")


class Augmenting(torch.utils.data.Dataset[torch.Tensor]):
    """Random noise from torch, numpy and python in every item."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> torch.Tensor:
        noise = torch.rand(2) + float(np.random.rand()) + random.random()
        return torch.cat([torch.tensor([float(index)]), noise])


def _seed() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)


def setups(workers: int) -> dict[str, Callable[[], Any]]:
    data = list(range(N))
    aug = sk.data.SeededDataset(Augmenting(), seed=3)

    def resumable(drop_last: bool = False) -> Any:
        sampler = sk.data.ResumableSampler(data, seed=7)
        return sk.data.ResumableLoader(
            torch.utils.data.DataLoader(
                data, batch_size=BATCH, sampler=sampler, num_workers=workers, drop_last=drop_last
            )
        )

    def batch_sampler() -> Any:
        bs = sk.data.ResumableBatchSampler(sk.data.ResumableSampler(data, seed=7), BATCH)
        return sk.data.ResumableLoader(
            torch.utils.data.DataLoader(data, batch_sampler=bs, num_workers=workers)
        )

    return {
        "dataloader+ResumableSampler": resumable,
        "dataloader+ResumableSampler+drop_last": lambda: resumable(drop_last=True),
        "dataloader+ResumableBatchSampler": batch_sampler,
        "stateful+ResumableSampler": lambda: StatefulDataLoader(
            data, batch_size=BATCH, sampler=sk.data.ResumableSampler(data, seed=7),
            num_workers=workers),
        "stateful+shuffle+generator": lambda: StatefulDataLoader(
            data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(1),
            num_workers=workers),
        "stateful+torchdata-RandomSampler(generator)": lambda: StatefulDataLoader(
            data, batch_size=BATCH, num_workers=workers,
            sampler=TorchdataRandomSampler(data, generator=torch.Generator().manual_seed(2))),
        "augmenting+SeededDataset": lambda: sk.data.ResumableLoader(torch.utils.data.DataLoader(
            aug, batch_size=BATCH, sampler=sk.data.ResumableSampler(aug, seed=5),
            num_workers=workers)),
    }  # fmt: skip


def batches(loader: Any) -> Iterator[list[float]]:
    """Batches across epochs, as a step-based training loop takes them."""
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        yield torch.as_tensor(batch).flatten().tolist()


def total_batches(build: Callable[[], Any]) -> int:
    loader = build()
    return EPOCHS * len(loader)


def main() -> None:
    mode, directory, workers = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    out: dict[str, Any] = {}
    for name, build in setups(workers).items():
        total = total_batches(build)
        if mode == "save":
            _seed()
            out[name] = [b for _, b in zip(range(total), batches(build()), strict=False)]
        runs = []
        for k in range(total + 1):
            _seed()
            loader = build()
            state = {"loader": loader, "rng": sk.RNGState()}
            path = directory / name / str(k)
            if mode == "save":
                for _, _b in zip(range(k), batches(loader), strict=False):
                    pass
                sk.save(path, state, step=k)
            else:
                torch.manual_seed(1234)  # a different global state: the load must restore it
                sk.load(path, state)
                runs.append([b for _, b in zip(range(total - k), batches(loader), strict=False)])
        if mode == "resume":
            out[name] = runs
    print(json.dumps(out))


if __name__ == "__main__":
    main()
