"""Per-rank state of a multi-process Lightning checkpoint, resumed by fewer processes."""

from __future__ import annotations

import pytest

import statekeeper as sk
from statekeeper.integrations.lightning_ranks import pick


def test_a_two_rank_checkpoint_resumed_by_one_process_is_refused() -> None:
    """Without a process group the run is one rank: rank 0's RNG and loader states (saved
    for two ranks' samplers) must not be taken silently."""
    rng0, rng1 = {"torch": "rank0"}, {"torch": "rank1"}
    checkpoint = {
        "rng": rng0,
        "statekeeper_ranks": [{"rng": rng0, "loaders": None}, {"rng": rng1, "loaders": None}],
    }
    with pytest.raises(sk.errors.LoadStateError, match="2 ranks, the run has 1"):
        pick(checkpoint, "rng")


def test_a_one_rank_list_resumed_by_one_process_is_its_own() -> None:
    rng = {"torch": "mine"}
    checkpoint = {"rng": {"torch": "other"}, "statekeeper_ranks": [{"rng": rng, "loaders": None}]}
    pick(checkpoint, "rng")
    assert checkpoint["rng"] == rng


def test_no_rank_zero_warning_for_worker_rng_in_a_multi_process_run() -> None:
    """Each rank's WorkerRNGDataset state is saved and restored (``pick``): a DDP fit must
    not be told that every rank resumes rank 0's."""
    import warnings
    from types import SimpleNamespace

    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    from statekeeper.integrations.lightning_warn import warn_inexact

    data = sk.data.WorkerRNGDataset(torch.utils.data.TensorDataset(torch.arange(8.0)))
    loader = StatefulDataLoader(data, batch_size=2, num_workers=2)
    combined = SimpleNamespace(flattened=[loader])
    trainer = SimpleNamespace(world_size=2, fit_loop=SimpleNamespace(_combined_loader=combined))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_inexact(trainer)
    assert [str(w.message) for w in caught] == []
