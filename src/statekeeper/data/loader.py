"""``ResumableLoader``: exact data position for a plain ``torch.utils.data.DataLoader``.

A plain ``DataLoader`` has no state. Give it a :class:`ResumableSampler` (``sampler=`` or
inside a :class:`ResumableBatchSampler`) and wrap it::

    sampler = sk.data.ResumableSampler(dataset, seed=0)
    loader = sk.data.ResumableLoader(
        DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4)
    )
    state = {"model": model, "opt": opt, "loader": loader}

The wrapper counts the batches the loop received (workers prefetch batches ahead of that),
so its ``state_dict`` is the position of the next batch to be *used*, and after
``load_state_dict`` the next ``iter(loader)`` starts exactly there, without drawing from the
global generator (the run that saved drew its epoch's base seed before the save).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from statekeeper.data.sampler import ResumableBatchSampler, ResumableSampler
from statekeeper.errors import InvalidArgumentError

__all__ = ["ResumableLoader"]


def _resumable_parts(loader: torch.utils.data.DataLoader[Any]) -> tuple[ResumableSampler, int]:
    """The loader's ResumableSampler and how many samples one batch takes from it."""
    batch_sampler = loader.batch_sampler
    if isinstance(batch_sampler, ResumableBatchSampler):
        return batch_sampler.sampler, batch_sampler.batch_size
    sampler = (
        getattr(batch_sampler, "sampler", None) if batch_sampler is not None else loader.sampler
    )
    if isinstance(sampler, ResumableSampler):
        return sampler, getattr(batch_sampler, "batch_size", None) or 1
    raise InvalidArgumentError(
        "ResumableLoader needs a DataLoader whose sampler is a statekeeper.data.ResumableSampler "
        "(sampler=ResumableSampler(dataset, seed=...), or "
        "batch_sampler=ResumableBatchSampler(...)); "
        f"this one samples with {type(sampler or batch_sampler).__name__}"
    )


class ResumableLoader:
    """A ``DataLoader`` that knows which batch comes next, and can resume there.

    Args:
        loader: The ``DataLoader`` to wrap (its sampler a :class:`ResumableSampler`, or a
            batch sampler a :class:`ResumableBatchSampler`).

    Raises:
        InvalidArgumentError: The loader's sampler is no :class:`ResumableSampler` (nor its
            batch sampler a :class:`ResumableBatchSampler`).
    """

    def __init__(self, loader: torch.utils.data.DataLoader[Any]) -> None:
        self.loader = loader
        self.sampler, self._per_batch = _resumable_parts(loader)
        self._epoch = self.sampler.epoch
        self._position = self.sampler.position
        self._left: tuple[int, int] | None = None
        self._resumed = False

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        s = self.sampler
        if self._left == (s.epoch, s.position):  # an iteration left early: rewind the prefetch
            s.epoch, s.position = self._epoch, self._position
        else:  # first iteration, or the user moved the sampler (set_epoch)
            self._epoch, self._position = s.epoch, s.position
        total = len(s)
        if self._resumed and s.position > 0:
            # building an iterator draws a base seed from the global generator; the run that
            # saved drew it at the start of this epoch, so a mid-epoch resume must not draw again
            with torch.random.fork_rng(devices=[]):
                batches = iter(self.loader)
        else:
            batches = iter(self.loader)
        self._resumed = False
        try:
            for batch in batches:
                self._position = min(self._position + self._per_batch, total)
                yield batch
            self._epoch, self._position = self._epoch + 1, 0
        finally:
            self._left = (s.epoch, s.position)

    def state_dict(self) -> dict[str, int]:
        """The position of the next batch the loop will receive (not of the prefetched ones).

        Returns:
            ``{"seed", "epoch", "position"}``, the position that of the next batch received.
        """
        return {"seed": self.sampler.seed, "epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        self._epoch, self._position = self.sampler.epoch, self.sampler.position
        self._left = None
        self._resumed = True
