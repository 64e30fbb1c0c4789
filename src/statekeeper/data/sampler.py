"""Samplers whose order is a pure function of (seed, epoch) and whose state is a position.

``ResumableSampler`` yields the indices of epoch ``e`` as ``permutation(seed, e)`` (or
``range(n)`` without shuffling), sharded for distributed ranks the way
``DistributedSampler`` does (padded by wrapping, or cut with ``drop_last``). Its state is
``{"seed", "epoch", "position"}``: resuming needs no generator state at all, so there is
nothing to get wrong. The indices it yields are :class:`SampleIndex` ints that also carry
their epoch, which :class:`~statekeeper.data.seeding.SeededDataset` uses to seed per-sample
randomness.

A sampler only knows how many indices it *handed out*; a ``DataLoader`` with workers asks
for several batches ahead. Wrap a plain ``DataLoader`` in
:class:`~statekeeper.data.loader.ResumableLoader`, which counts the batches the training
loop actually received. torchdata's ``StatefulDataLoader`` does that counting itself and
uses the iterator's ``state_dict`` / ``load_state_dict`` defined here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sized
from typing import Any

import torch

from statekeeper.errors import InvalidArgumentError

__all__ = ["ResumableBatchSampler", "ResumableSampler", "SampleIndex", "epoch_seed"]


def epoch_seed(seed: int, epoch: int, *salt: int) -> int:
    """A 63-bit seed that depends only on its arguments (stable across processes and versions)."""
    text = ":".join(str(v) for v in (seed, epoch, *salt)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


class SampleIndex(int):
    """A dataset index that also carries the epoch it was drawn in."""

    epoch: int

    def __new__(cls, value: int, epoch: int) -> SampleIndex:
        obj = super().__new__(cls, value)
        obj.epoch = epoch
        return obj

    def __reduce__(self) -> tuple[Any, ...]:  # to worker processes and back
        return (SampleIndex, (int(self), self.epoch))


def _check_int(name: str, value: object, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class _SamplerIterator(Iterator[SampleIndex]):
    """Iterates one epoch from the sampler's position; torchdata saves and loads it."""

    def __init__(self, sampler: ResumableSampler) -> None:
        self.sampler = sampler
        self.epoch = sampler.epoch
        self.order = sampler.epoch_indices(self.epoch)

    def __iter__(self) -> _SamplerIterator:
        return self

    def __next__(self) -> SampleIndex:
        s = self.sampler
        if s.epoch != self.epoch or s.position >= len(self.order):
            if s.epoch == self.epoch:
                s.epoch, s.position = self.epoch + 1, 0
            raise StopIteration
        index = SampleIndex(self.order[s.position], self.epoch)
        s.position += 1
        return index

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        if self.epoch != self.sampler.epoch:
            self.epoch = self.sampler.epoch
            self.order = self.sampler.epoch_indices(self.epoch)


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Indices as a pure function of (seed, epoch), resumable at any position.

    ``data_source`` is the dataset (or anything with ``len``). ``num_replicas`` / ``rank``
    shard each epoch across distributed ranks; every rank gets ``len(self)`` indices.

    Args:
        data_source: The dataset, or anything with ``len``.
        seed: The seed the order of every epoch derives from.
        shuffle: ``False`` for the sequential order.
        num_replicas: The number of ranks that share the data.
        rank: This rank, below ``num_replicas``.
        drop_last: Drop the tail that does not divide among the ranks (else it is padded).

    Raises:
        InvalidArgumentError: A negative seed or count, or ``rank`` not below ``num_replicas``.
    """

    def __init__(
        self,
        data_source: Sized,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ) -> None:
        self.data_source = data_source
        self.seed = _check_int("seed", seed, 0)
        self.shuffle = bool(shuffle)
        self.num_replicas = _check_int("num_replicas", num_replicas, 1)
        self.rank = _check_int("rank", rank, 0)
        if rank >= num_replicas:
            raise InvalidArgumentError(f"rank {rank} is not below num_replicas {num_replicas}")
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        n, r = len(self.data_source), self.num_replicas
        return n // r if self.drop_last else -(-n // r)

    def epoch_indices(self, epoch: int) -> list[int]:
        """This rank's indices for ``epoch``, in order.

        Args:
            epoch: The epoch.

        Returns:
            The indices, a pure function of the seed, ``epoch``, the rank and the replicas.
        """
        n = len(self.data_source)
        if self.shuffle:
            gen = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
            order = torch.randperm(n, generator=gen).tolist()
        else:
            order = list(range(n))
        total = len(self) * self.num_replicas
        while len(order) < total:  # pad by wrapping, as DistributedSampler does
            order += order[: total - len(order)]
        return order[self.rank : total : self.num_replicas]

    def __iter__(self) -> _SamplerIterator:
        return _SamplerIterator(self)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (the DistributedSampler convention).

        Args:
            epoch: The epoch whose order the next iteration yields, from its first index.
        """
        if _check_int("epoch", epoch, 0) != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed") != self.seed:
            raise InvalidArgumentError(
                f"sampler state was saved with seed {state.get('seed')!r}, this sampler has seed "
                f"{self.seed}: build it with the same seed to resume the same order"
            )
        epoch, position = state["epoch"], state["position"]
        _check_int("epoch", epoch, 0)
        if not 0 <= _check_int("position", position, 0) <= len(self):
            raise InvalidArgumentError(
                f"sampler position {position} is past the epoch's {len(self)} indices"
            )
        self.epoch, self.position = epoch, position


class ResumableBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of a :class:`ResumableSampler`; its position counts samples, like the sampler's.

    Args:
        sampler: The :class:`ResumableSampler` whose indices are batched.
        batch_size: The number of indices per batch.
        drop_last: Drop the last, incomplete batch.

    Raises:
        InvalidArgumentError: ``sampler`` is no :class:`ResumableSampler`, or ``batch_size`` is
            not a positive int.
    """

    def __init__(self, sampler: ResumableSampler, batch_size: int, drop_last: bool = False) -> None:
        if not isinstance(sampler, ResumableSampler):
            raise InvalidArgumentError("ResumableBatchSampler needs a ResumableSampler")
        self.sampler = sampler
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.drop_last = bool(drop_last)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        it = iter(self.sampler)
        while True:
            if self.drop_last and len(self.sampler) - self.sampler.position < self.batch_size:
                for _ in it:  # finish the epoch without yielding the short batch
                    pass
                return
            batch: list[int] = [i for _, i in zip(range(self.batch_size), it, strict=False)]
            if not batch:
                return
            yield batch

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
