"""The worker-RNG hook is reported as carrying only when the workers of the loader's current
iterator were started with it (a hook installed too late is warned about), and a loader
state that does not fit is a statekeeper error naming the entry and the fix."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import statekeeper as sk
from statekeeper.data.worker_rng import (
    carries_worker_rng,
    carry_worker_rng,
    warn_late,
    workers_without_rng,
)


class Augmented(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        noise = torch.rand(1).item() + float(np.random.rand()) + random.random()
        return torch.tensor([float(index), noise])


def _loader(persistent: bool, generator: bool = True) -> StatefulDataLoader:
    return StatefulDataLoader(
        Augmented(), batch_size=2, shuffle=True, num_workers=2, persistent_workers=persistent,
        generator=torch.Generator().manual_seed(3) if generator else None,
        multiprocessing_context="fork",
    )  # fmt: skip


def _epoch(it: object) -> None:
    # (typing) the loader type is chosen at run time; mypy sees the base class
    for _ in it:  # type: ignore[attr-defined]
        pass


@pytest.mark.parametrize("persistent", [True, False])
def test_a_hook_installed_after_the_workers_started_carries_nothing_and_says_so(
    tmp_path: Path, persistent: bool
) -> None:
    """The hook came after the workers started: not reported as carrying (before: True, for
    a state whose worker snapshots hold no RNG, so the save said nothing), and the save
    warns; once a new iterator started the workers with it (the next epoch, without
    persistent workers) it carries, and the snapshots hold the RNG."""
    loader = _loader(persistent)
    it = iter(loader)
    next(it)  # the workers run, started without the hook
    assert carry_worker_rng(loader) is False
    assert not carries_worker_rng(loader)
    assert workers_without_rng(loader.state_dict()) == ["worker_0", "worker_1"]
    with pytest.warns(sk.StatekeeperWarning, match="workers draw in __getitem__.*not saved"):
        sk.save(tmp_path / "run", {"loader": loader}, step=1)
    with pytest.warns(sk.StatekeeperWarning, match="after its workers had started"):
        warn_late(loader, "Hand it over first")
    _epoch(it)
    _epoch(iter(loader))  # the next epoch: a new iterator (non-persistent), the same (persistent)
    state = loader.state_dict()
    assert carries_worker_rng(loader) is (not persistent)
    assert (workers_without_rng(state) == []) is (not persistent)  # what it reports is true


def test_a_hook_installed_before_the_first_iterator_carries_without_a_warning() -> None:
    import warnings

    loader = _loader(persistent=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sk.StatekeeperWarning)
        assert carry_worker_rng(loader) is True
    it = iter(loader)
    next(it)
    assert carries_worker_rng(loader) and workers_without_rng(loader.state_dict()) == []


def test_a_loader_state_that_does_not_fit_names_the_entry_and_the_fix(tmp_path: Path) -> None:
    """Through ``LoaderState`` (Fabric's route, which calls its ``load_state_dict``) a bare
    ValueError escaped; through ``sk.load`` the fix was missing."""
    from statekeeper.integrations.lightning import LoaderState

    held = LoaderState(_loader(persistent=False))
    with pytest.raises(sk.errors.CheckpointUnreadableError, match=r"'loader'.*drop the loader"):
        held.load_state_dict({"position": 3})
    saved = LoaderState(_loader(persistent=False)).state_dict()
    with pytest.raises(sk.errors.InvalidArgumentError, match=r"'loader'.*had a loader generator"):
        LoaderState(_loader(persistent=False, generator=False)).load_state_dict(saved)
    sk.save(tmp_path / "run", {"train_loader": {"position": 3}}, step=1)
    with pytest.raises(
        sk.errors.LoadStateError, match=r"'train_loader'.*drop the loader from the state"
    ):
        sk.load(tmp_path / "run", {"train_loader": _loader(persistent=False)})
    sk.save(tmp_path / "other", {"train_loader": _loader(persistent=False)}, step=1)
    live = _loader(persistent=False, generator=False)
    with pytest.raises(
        sk.errors.LoadStateError, match=r"'train_loader'.*build the loader as the saving"
    ):
        sk.load(tmp_path / "other", {"train_loader": live})


def test_a_second_late_call_says_it_is_still_late() -> None:
    """Called again for a loader whose hook came too late, it still says so (before: True
    on the second call, while carries_worker_rng was False)."""
    loader = _loader(persistent=True)
    it = iter(loader)
    next(it)
    assert carry_worker_rng(loader) is False
    assert carry_worker_rng(loader) is False
    assert carry_worker_rng(loader) is carries_worker_rng(loader)
    _epoch(it)
