"""Plain values (the epoch, counters) come back into the caller's mapping, as objects do."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest
import torch

import statekeeper as sk


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 3)


def test_load_assigns_plain_values_into_the_state(tmp_path: Path) -> None:
    sk.save(tmp_path, {"model": _model(1), "epoch": 3, "name": "run", "pair": (1, 2)}, step=5)
    state = {"model": _model(2), "epoch": 0, "name": "", "pair": (0, 0)}
    info = sk.load(tmp_path, state)
    assert (state["epoch"], state["name"], state["pair"]) == (3, "run", (1, 2))
    assert info.values == {"epoch": 3, "name": "run", "pair": (1, 2)}
    # (typing) the value stored under model is the model the test saved
    assert torch.equal(state["model"].weight, _model(1).weight)  # type: ignore[attr-defined]


def test_restore_latest_assigns_plain_values_into_the_state(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.save(5, {"model": _model(1), "epoch": 3})
    state = {"model": _model(2), "epoch": 0}
    with sk.Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore_latest(state) == 5
    assert state["epoch"] == 3


def test_a_read_only_mapping_with_plain_values_is_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    sk.save(tmp_path, {"model": _model(1), "epoch": 3}, step=5)
    model = _model(2)
    before = model.weight.clone()
    frozen = MappingProxyType({"model": model, "epoch": 0})
    with pytest.raises(
        sk.errors.InvalidArgumentError, match=r"plain values \(epoch\).*statekeeper.Value"
    ):
        sk.load(tmp_path, frozen)
    with sk.Checkpointer(tmp_path) as ckpt, pytest.raises(sk.errors.InvalidArgumentError):
        ckpt.restore_latest(frozen)
    assert torch.equal(model.weight, before)
    sk.save(tmp_path, {"model": _model(1), "epoch": sk.Value(4)}, step=6)
    counter = sk.Value(0)
    sk.load(tmp_path, MappingProxyType({"model": model, "epoch": counter}))
    assert counter.value == 4


def test_restore_latest_in_a_directory_of_other_files_says_so(tmp_path: Path) -> None:
    torch.save(_model(1).state_dict(), tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text("{}")
    with (
        pytest.warns(sk.StatekeeperWarning, match=r"holds no statekeeper step but 2 other"),
        sk.Checkpointer(tmp_path) as ckpt,
    ):
        assert ckpt.restore_latest({"model": _model(2)}) is None
    empty = tmp_path / "fresh"
    with sk.Checkpointer(empty) as ckpt:  # a new run directory: nothing to say
        assert ckpt.restore_latest({"model": _model(2)}) is None
