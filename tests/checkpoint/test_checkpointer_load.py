"""``Checkpointer.load`` (a given step, or the newest, through the Checkpointer's tiers) and
``Checkpointer.last_restore`` (the ``RestoreInfo`` of the last restore)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import statekeeper as sk


def _model(value: float) -> torch.nn.Linear:
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


def _run(directory: Path, steps: tuple[int, ...] = (1, 2, 3)) -> None:
    with sk.Checkpointer(directory) as ckpt:
        for step in steps:
            ckpt.save(step, {"model": _model(float(step)), "epoch": step * 10})


def test_restore_latest_returns_the_step_and_keeps_its_restore_info(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path / "empty") as ckpt:
        assert ckpt.last_restore is None
        assert ckpt.restore_latest({"model": _model(0.0)}) is None
        assert ckpt.last_restore is None  # nothing restored
    _run(tmp_path / "run")
    model = _model(0.0)
    state = {"model": model, "epoch": 0}
    with sk.Checkpointer(tmp_path / "run") as ckpt:
        assert ckpt.last_restore is None
        assert ckpt.restore_latest(state) == 3
        info = ckpt.last_restore
    assert isinstance(info, sk.RestoreInfo)
    assert (info.step, info.path) == (3, str(tmp_path / "run" / "step_000000003"))
    assert info.values == {"epoch": 30} and state["epoch"] == 30
    assert torch.equal(model.weight, torch.full((2, 2), 3.0))


def test_load_of_a_given_step_and_of_the_newest(tmp_path: Path) -> None:
    _run(tmp_path)
    model = _model(0.0)
    state = {"model": model, "epoch": 0}
    with sk.Checkpointer(tmp_path) as ckpt:
        info = ckpt.load(state, 2)
        assert (info.step, state["epoch"]) == (2, 20) and ckpt.last_restore is info
        assert torch.equal(model.weight, torch.full((2, 2), 2.0))
        newest = ckpt.load(state)
        assert (newest.step, state["epoch"]) == (3, 30) and ckpt.last_restore is newest
        with pytest.raises(sk.StepNotFoundError):
            ckpt.load(state, step=9)
        assert ckpt.last_restore is newest  # a failed load changes nothing
        with pytest.raises(sk.errors.InvalidArgumentTypeError, match="step"):
            ckpt.load(state, step="2")


def test_load_restores_the_checkpointers_rng(tmp_path: Path) -> None:
    torch.manual_seed(5)
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"model": _model(1.0)})
        expected = torch.rand(3)
    torch.manual_seed(99)
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.load({"model": _model(0.0)}, 1)
    assert torch.equal(torch.rand(3), expected)


def test_load_raises_for_a_damaged_step_where_restore_latest_skips_it(tmp_path: Path) -> None:
    _run(tmp_path)
    shard = next((tmp_path / "step_000000003").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    model = _model(0.0)
    with sk.Checkpointer(tmp_path) as ckpt:
        with pytest.raises(sk.CorruptCheckpointError):
            ckpt.load({"model": model, "epoch": 0}, 3)
        assert torch.equal(model.weight, torch.zeros(2, 2))  # untouched
        with pytest.warns(sk.StatekeeperWarning, match="skipping damaged step 3"):
            assert ckpt.restore_latest({"model": model, "epoch": 0}) == 2


def test_retention_keeps_the_step_loaded(tmp_path: Path) -> None:
    _run(tmp_path)
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1)) as ckpt:
        ckpt.load({"model": _model(0.0), "epoch": 0}, 1)
        ckpt.save(4, {"model": _model(4.0), "epoch": 40})
    assert [i.step for i in sk.list_checkpoints(tmp_path)] == [1, 4]


def test_load_through_the_mirror_of_a_step_only_the_mirror_holds(tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    with sk.Checkpointer(local, mirror=sk.Mirror(remote)) as ckpt:
        for step in (1, 2):
            ckpt.save(step, {"model": _model(float(step)), "epoch": step * 10})
        ckpt.wait()
    shutil.rmtree(local / "step_000000001")  # the local tier lost it: the mirror has it
    model = _model(0.0)
    state = {"model": model, "epoch": 0}
    with sk.Checkpointer(local, mirror=sk.Mirror(remote)) as ckpt:
        info = ckpt.load(state, 1)
        assert info.path == str(remote / "step_000000001")
        assert torch.equal(model.weight, torch.full((2, 2), 1.0)) and state["epoch"] == 10
        assert ckpt.load(state).step == 2
        assert ckpt.last_restore is not None
        assert ckpt.last_restore.path == str(local / "step_000000002")
        with pytest.raises(sk.StepNotFoundError, match="its mirror"):
            ckpt.load(state, 7)
