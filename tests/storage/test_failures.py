"""A save interrupted at any single storage operation leaves no committed step."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import trained

import statekeeper as sk
from statekeeper.storage.memory import MemoryStorage
from statekeeper.testing import assert_state_equal


def _state(seed: int) -> dict[str, object]:
    model, opt = trained(seed)
    tied = torch.nn.Linear(4, 4)
    return {"model": model, "opt": opt, "tied": {"a": tied.weight, "b": tied.weight}, "step": seed}


def _count_operations() -> int:
    storage = MemoryStorage()
    sk.save(storage, _state(1), step=1)
    before = storage.operations
    sk.save(storage, _state(2), step=2, shard_bytes=512)
    return storage.operations - before


def test_a_save_has_many_operations() -> None:
    assert (
        _count_operations() >= 10
    )  # mkdir, several writes + fsyncs, fsync_dir, rename, fsync_root


@pytest.mark.parametrize("crash", [False, True], ids=["error", "power-cut"])
def test_failure_at_every_operation_leaves_previous_step_intact(crash: bool) -> None:
    ops = _count_operations()
    base = MemoryStorage()
    sk.save(base, _state(1), step=1)
    expected = sk.read(base)
    reference = MemoryStorage()
    sk.save(reference, _state(2), step=2, shard_bytes=512)
    expected2 = sk.read(reference)
    for k in range(ops):
        storage = base.copy()
        storage.fail_at = storage.operations + k
        with pytest.raises(sk.storage.InjectedFailure):
            sk.save(storage, _state(2), step=2, shard_bytes=512)
        if crash:
            storage.crash()
        steps = [c.step for c in sk.list_checkpoints(storage)]
        if crash or k < ops - 1:
            assert steps == [1], f"operation {k}"
        else:  # only the final directory fsync failed: the renamed step is complete
            assert steps == [1, 2]
            assert_state_equal(sk.read(storage, step=2), expected2)
        assert_state_equal(sk.read(storage, step=1), expected)
        live_model, live_opt = trained(7)
        sk.load(storage, {"model": live_model, "opt": live_opt, "tied": {}, "step": 0}, step=1)
        assert_state_equal(live_model.state_dict(), expected["model"])
        # the next save after the failure succeeds and is complete
        sk.save(storage, _state(2), step=2, shard_bytes=512, overwrite=True)
        assert [c.step for c in sk.list_checkpoints(storage)] == [1, 2]
        assert_state_equal(sk.read(storage), expected2)


def test_a_completed_save_survives_a_power_cut() -> None:
    storage = MemoryStorage()
    sk.save(storage, _state(1), step=1, shard_bytes=512)
    expected = sk.read(storage)
    storage.crash()
    assert_state_equal(sk.read(storage), expected)
    assert not sk.audit.list_partial(storage)


def test_power_cut_mid_save_leaves_only_a_partial_that_cleanup_removes() -> None:
    storage = MemoryStorage()
    sk.save(storage, _state(1), step=1)
    storage.fail_at = storage.operations + 3
    with pytest.raises(sk.storage.InjectedFailure):
        sk.save(storage, _state(2), step=2)
    # the failing save aborted its partial directory itself
    assert not sk.audit.list_partial(storage)
