"""Checkpointer: resume, save policies, retention, RNG order, the writer lock."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import statekeeper as sk
from statekeeper.loop import saving as saving_module
from statekeeper.storage.memory import MemoryStorage


def _steps(directory: Any) -> list[int]:
    return [c.step for c in sk.list_checkpoints(directory)]


def test_restore_latest_on_an_empty_directory_returns_none(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore_latest({"x": sk.Value(0)}) is None


def test_save_and_restore_latest_round_trip_with_rng(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 3)
    counter = sk.Value(0)
    with sk.Checkpointer(tmp_path) as ckpt:
        for step in (1, 2, 3):
            counter.value = step
            ckpt.save(step, {"model": model, "counter": counter})
        torch.manual_seed(5)
        expected = torch.rand(3)
    fresh, fresh_counter = torch.nn.Linear(3, 3), sk.Value(0)
    with sk.Checkpointer(tmp_path) as ckpt:
        torch.manual_seed(5)
        torch.rand(3)  # move the global generator: restore must put it back
        assert ckpt.restore_latest({"model": fresh, "counter": fresh_counter}) == 3
    assert fresh_counter.value == 3
    assert torch.equal(fresh.weight, model.weight)
    torch.manual_seed(5)
    # the RNG state saved at step 3 is the one right after the draws before it
    assert torch.equal(torch.rand(3), expected)


def test_restore_latest_removes_interrupted_saves_first(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"x": 1})
    (tmp_path / "step_000000002.partial-abcdef").mkdir()
    with sk.Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore_latest({"x": 0}) == 1
    assert sk.audit.list_partial(tmp_path) == []


def test_a_damaged_newest_step_is_skipped_with_a_warning(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"x": sk.Value(1)})
        torch.rand(1)  # a new RNG state: step 2's file is its own, not step 1's (linked)
        ckpt.save(2, {"x": sk.Value(2)})
    shard = next((tmp_path / "step_000000002").glob("tensors-*"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    x = sk.Value(0)
    with (
        sk.Checkpointer(tmp_path) as ckpt,
        pytest.warns(sk.StatekeeperWarning, match="damaged step 2") as caught,
    ):
        assert ckpt.restore_latest({"x": x}) == 1
    assert x.value == 1
    assert caught[0].filename == __file__  # attributed to the caller's line


def test_maybe_save_follows_the_policy_and_skips_committed_steps(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path, every=sk.EverySteps(2) | sk.AtSteps(5)) as ckpt:
        saved = [s for s in range(8) if ckpt.maybe_save(s, {"x": s}) is not None]
        assert saved == [0, 2, 4, 5, 6]
        assert ckpt.maybe_save(6, {"x": 6}) is None
    with (
        sk.Checkpointer(tmp_path) as ckpt,
        pytest.raises(sk.errors.InvalidArgumentError, match="every="),
    ):
        ckpt.maybe_save(8, {"x": 8})


def test_every_seconds_uses_the_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(saving_module, "_clock", lambda: now[0])
    with sk.Checkpointer(tmp_path, every=sk.EverySeconds(10)) as ckpt:
        assert ckpt.maybe_save(1, {"x": 1}) is None
        now[0] = 10.0
        assert ckpt.maybe_save(2, {"x": 2}) is not None
        now[0] = 15.0
        assert ckpt.maybe_save(3, {"x": 3}) is None
    assert _steps(tmp_path) == [2]


def test_retention_keeps_latest_and_never_the_resumed_from_step(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(2)) as ckpt:
        for step in range(1, 6):
            ckpt.save(step, {"x": step})
        assert _steps(tmp_path) == [4, 5]
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1)) as ckpt:
        assert ckpt.restore_latest({"x": 0}) == 5
        ckpt.save(6, {"x": 6})
        ckpt.save(7, {"x": 7})
        assert _steps(tmp_path) == [5, 7]


def test_best_k_decisions_survive_a_resume(tmp_path: Path) -> None:
    losses = {1: 0.5, 2: 0.1, 3: 0.7, 4: 0.3, 5: 0.9}
    policy = sk.KeepBest(2, metric="loss")
    with sk.Checkpointer(tmp_path, keep=policy) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, {"x": step}, metrics={"loss": losses[step]})
    assert _steps(tmp_path) == [1, 2, 3]  # 3 is the newest: always kept
    with sk.Checkpointer(tmp_path, keep=policy) as ckpt:
        ckpt.restore_latest({"x": 0})
        for step in (4, 5):
            ckpt.save(step, {"x": step}, metrics={"loss": losses[step]})
    # best two from the manifests on disk (2 and 4), the resumed-from 3, the newest 5
    assert _steps(tmp_path) == [2, 3, 4, 5]


def test_a_failure_between_commit_and_retention_loses_nothing() -> None:
    storage = MemoryStorage()
    with sk.Checkpointer(storage, keep=sk.KeepLatest(1)) as ckpt:
        ckpt.save(1, {"x": 1})
        ops = storage.operations
        ckpt.save(2, {"x": 2})
        per_save = storage.operations - ops  # includes the removal of step 1
    storage = MemoryStorage()
    with sk.Checkpointer(storage, keep=sk.KeepLatest(1)) as ckpt:
        ckpt.save(1, {"x": 1})
        storage.fail_at = storage.operations + per_save - 1  # the removal of step 1
        with pytest.warns(sk.StatekeeperWarning, match="could not remove step 1"):
            info = ckpt.save(2, {"x": 2})  # committed: retention's failure does not fail it
        assert info.step == 2
        assert [p.step for p in ckpt.retention_status().pending] == [1]
        storage.crash()
        assert _steps(storage) == [1, 2]
        assert sk.read(storage)["x"] == 2
        ckpt.save(3, {"x": 3})  # retried: step 1 goes now
        assert _steps(storage) == [3]
        assert ckpt.retention_status().ok


def test_a_second_checkpointer_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    first = sk.Checkpointer(tmp_path)
    with pytest.raises(sk.errors.WriterConflictError):
        sk.Checkpointer(tmp_path)
    first.close()
    with pytest.raises(sk.StatekeeperError, match="closed"):
        first.save(1, {"x": 1})
    with sk.Checkpointer(tmp_path) as second:
        second.save(1, {"x": 1})


def test_the_rng_name_is_reserved(tmp_path: Path) -> None:
    with (
        sk.Checkpointer(tmp_path) as ckpt,
        pytest.raises(sk.errors.InvalidArgumentError, match="reserved"),
    ):
        ckpt.save(1, {"rng": 1})


class Drawer:
    """A Stateful whose state_dict and load_state_dict draw random numbers."""

    def state_dict(self) -> dict[str, Any]:
        return {"noise": torch.rand(1), "py": random.random()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.rand(1)
        random.random()


def test_rng_is_captured_first_and_restored_last(tmp_path: Path) -> None:
    torch.manual_seed(1)
    random.seed(1)
    before = (torch.get_rng_state(), random.getstate())
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"a": Drawer(), "z": Drawer()})
    saved = sk.read(tmp_path)["rng"]
    assert torch.equal(saved["torch"], before[0])
    assert saved["python"] == before[1]
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.restore_latest({"a": Drawer(), "z": Drawer()})
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]


def test_registered_generators_are_restored_by_name(tmp_path: Path) -> None:
    tgen, ngen = torch.Generator().manual_seed(3), np.random.default_rng(3)
    np.random.seed(9)
    with sk.Checkpointer(tmp_path, generators={"t": tgen, "n": ngen}) as ckpt:
        ckpt.save(1, {})
    expected = (torch.rand(4, generator=tgen), ngen.random(4), np.random.rand(2))
    tgen2, ngen2 = torch.Generator().manual_seed(0), np.random.default_rng(0)
    np.random.seed(0)
    with sk.Checkpointer(tmp_path, generators={"t": tgen2, "n": ngen2}) as ckpt:
        ckpt.restore_latest({})
    assert torch.equal(torch.rand(4, generator=tgen2), expected[0])
    assert np.array_equal(ngen2.random(4), expected[1])
    assert np.array_equal(np.random.rand(2), expected[2])
    other = sk.Checkpointer(tmp_path, generators={"other": tgen2})
    with other, pytest.raises(sk.KeyMismatchError, match="rng/generators/t: in the checkpoint"):
        other.restore_latest({})


def test_bad_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(sk.errors.InvalidArgumentError, match="KeepLatest"):
        sk.Checkpointer(tmp_path, keep=3)
    with pytest.raises(sk.errors.InvalidArgumentError, match="EverySteps"):
        sk.Checkpointer(tmp_path, every=10)
    with pytest.raises(TypeError, match="generator 'g'"):
        # (typing) a wrong type on purpose: the error is what is tested
        sk.Checkpointer(tmp_path, generators={"g": 1})  # type: ignore[dict-item]
