"""ResumableSampler, ResumableBatchSampler, ResumableLoader and the torchdata refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import statekeeper as sk


def test_order_is_a_pure_function_of_seed_and_epoch() -> None:
    a, b = sk.data.ResumableSampler(range(50), seed=3), sk.data.ResumableSampler(range(50), seed=3)
    torch.manual_seed(0)
    first = list(a)
    torch.manual_seed(99)  # the global generator plays no part
    assert list(b) == first
    assert sorted(first) == list(range(50))
    assert list(a) != first  # epoch 1 is another permutation
    assert a.epoch == 2 and b.epoch == 1
    assert list(sk.data.ResumableSampler(range(50), seed=4)) != first


def test_indices_carry_their_epoch() -> None:
    sampler = sk.data.ResumableSampler(range(4), seed=0)
    list(sampler)
    assert {i.epoch for i in sampler} == {1}


@pytest.mark.parametrize(
    ("n", "replicas", "drop_last"), [(10, 3, False), (10, 3, True), (9, 3, False)]
)
def test_ranks_partition_each_epoch(n: int, replicas: int, drop_last: bool) -> None:
    ranks = [
        sk.data.ResumableSampler(
            range(n), seed=1, num_replicas=replicas, rank=r, drop_last=drop_last
        )
        for r in range(replicas)
    ]
    shards = [list(s) for s in ranks]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == len(ranks[0])
    seen = [i for s in shards for i in s]
    if drop_last:
        assert len(set(seen)) == len(seen) == (n // replicas) * replicas
    else:
        assert set(seen) == set(range(n))  # every sample, a few twice (padding)


def test_resuming_mid_epoch_continues_the_same_order() -> None:
    sampler = sk.data.ResumableSampler(range(30), seed=2)
    it = iter(sampler)
    head = [next(it) for _ in range(11)]
    state = sampler.state_dict()
    rest = list(it)
    fresh = sk.data.ResumableSampler(range(30), seed=2)
    fresh.load_state_dict(state)
    assert list(fresh) == rest
    assert len(head) + len(rest) == 30


def test_bad_states_and_arguments_are_refused() -> None:
    sampler = sk.data.ResumableSampler(range(5), seed=2)
    with pytest.raises(sk.errors.InvalidArgumentError, match="seed 1"):
        sampler.load_state_dict({"seed": 1, "epoch": 0, "position": 0})
    with pytest.raises(sk.errors.InvalidArgumentError, match="past the epoch"):
        sampler.load_state_dict({"seed": 2, "epoch": 0, "position": 6})
    with pytest.raises(sk.errors.InvalidArgumentError, match="rank"):
        sk.data.ResumableSampler(range(5), num_replicas=2, rank=2)
    with pytest.raises(sk.errors.InvalidArgumentError, match="ResumableSampler"):
        sk.data.ResumableLoader(torch.utils.data.DataLoader(range(5), shuffle=True))


def test_set_epoch_starts_that_epoch_over() -> None:
    sampler = sk.data.ResumableSampler(range(8), seed=0)
    epoch3 = sampler.epoch_indices(3)
    sampler.set_epoch(3)
    assert list(sampler) == epoch3


def test_batch_sampler_drop_last_skips_the_short_batch_and_moves_on() -> None:
    bs = sk.data.ResumableBatchSampler(
        sk.data.ResumableSampler(range(10), seed=0), 4, drop_last=True
    )
    assert [len(b) for b in bs] == [4, 4]
    assert bs.sampler.epoch == 1 and len(bs) == 2


def test_loader_rewinds_what_workers_prefetched_when_a_loop_breaks() -> None:
    data = list(range(40))
    loader = sk.data.ResumableLoader(
        torch.utils.data.DataLoader(
            data, batch_size=2, sampler=sk.data.ResumableSampler(data, seed=1), num_workers=2
        )
    )
    expected = [b.tolist() for b in loader]  # epoch 0
    loader.load_state_dict({"seed": 1, "epoch": 0, "position": 0})
    taken = []
    for batch in loader:
        taken.append(batch.tolist())
        if len(taken) == 3:
            break
    assert loader.state_dict() == {"seed": 1, "epoch": 0, "position": 6}
    taken += [b.tolist() for b in loader]  # the same epoch, from the next unused batch
    assert taken == expected
    assert loader.state_dict()["epoch"] == 1


def test_plain_dataloader_in_the_state_is_refused_with_the_fix(tmp_path: Path) -> None:
    loader: torch.utils.data.DataLoader[int] = torch.utils.data.DataLoader(range(8), shuffle=True)
    with pytest.raises(sk.errors.InvalidArgumentError, match="ResumableLoader"):
        sk.save(tmp_path, {"loader": loader}, step=1)


@pytest.mark.parametrize(
    "sampler",
    [
        torch.utils.data.RandomSampler(range(8), generator=torch.Generator().manual_seed(0)),
        torch.utils.data.RandomSampler(range(8)),
        torch.utils.data.SubsetRandomSampler(list(range(8))),
        torch.utils.data.WeightedRandomSampler([1.0] * 8, 8),
    ],
    ids=lambda s: type(s).__name__,
)
def test_stateful_dataloader_with_a_stateless_random_sampler_is_refused(
    tmp_path: Path, sampler: torch.utils.data.Sampler[int]
) -> None:
    loader = StatefulDataLoader(range(8), sampler=sampler, batch_size=2)
    with pytest.raises(sk.errors.InvalidArgumentError, match="cannot resume the same order"):
        sk.save(tmp_path, {"loader": loader}, step=1)
    assert sk.list_checkpoints(tmp_path) == []


def test_plain_torchdata_restore_loses_the_order_statekeeper_keeps(tmp_path: Path) -> None:
    def build() -> StatefulDataLoader:
        return StatefulDataLoader(
            range(24), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1)
        )

    def epochs(loader: StatefulDataLoader, skip: int) -> list[list[int]]:
        out: list[list[int]] = []
        it = iter(loader)
        while len(out) < 18 - skip:
            try:
                out.append(next(it).tolist())
            except StopIteration:
                it = iter(loader)
        return out

    full = epochs(build(), 0)
    loader = build()
    it = iter(loader)
    for _ in range(6):  # all of epoch 0
        next(it)
    it = iter(loader)
    next(it)
    next(it)  # two batches into epoch 1
    own_state = loader.state_dict()
    sk.save(tmp_path, {"loader": loader}, step=8)
    plain = build()
    plain.load_state_dict(own_state)
    assert epochs(plain, 8) != full[8:]  # torchdata alone: epoch 2 is shuffled differently
    ours = build()
    sk.load(tmp_path, {"loader": ours})
    assert epochs(ours, 8) == full[8:]


def test_registering_the_loaders_own_generator_is_refused(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(1)
    loader = StatefulDataLoader(range(8), shuffle=True, generator=gen)
    with pytest.raises(sk.errors.InvalidArgumentError, match="unregister it"):
        sk.save(tmp_path, {"loader": loader, "rng": sk.RNGState({"data": gen})}, step=1)


def test_seeded_dataset_restores_the_callers_generators() -> None:
    class Draw(torch.utils.data.Dataset[float]):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> float:
            return float(torch.rand(1))

    data = sk.data.SeededDataset(Draw(), seed=4)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    first = [data[i] for i in range(3)]
    assert torch.equal(torch.get_rng_state(), before)
    assert [data[i] for i in range(3)] == first
    assert len(set(first)) == 3
