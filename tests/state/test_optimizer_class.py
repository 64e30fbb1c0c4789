"""An optimizer of another class is a mismatch before anything loads, unless switched on
purpose (``OptimizerChange.RESTART``: fresh state, learning rates carried over)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import statekeeper as sk
from statekeeper.checkpoint.save import capture
from statekeeper.checkpoint.writer import write_step


def _trained(opt_cls: Any, **kw: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = opt_cls(model.parameters(), **kw)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def _saved(tmp_path: Path) -> Path:
    model, opt = _trained(torch.optim.AdamW, lr=0.01)
    sk.save(tmp_path, {"model": model, "opt": opt}, step=1)
    return tmp_path


@pytest.mark.parametrize(
    ("cls", "kw"),
    [(torch.optim.SGD, {"lr": 0.5, "momentum": 0.9}), (torch.optim.Adam, {"lr": 0.5})],
)
def test_another_optimizer_class_is_refused_before_the_model_changes(
    tmp_path: Path, cls: Any, kw: dict[str, Any]
) -> None:
    run = _saved(tmp_path)
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    before = model.weight.clone()
    opt = cls(model.parameters(), **kw)
    with pytest.raises(sk.KeyMismatchError) as caught:
        sk.load(run, {"model": model, "opt": opt})
    text = str(caught.value)
    assert "torch.optim.adamw.AdamW in the checkpoint" in text
    assert f"{cls.__module__}.{cls.__qualname__} live" in text
    assert "OptimizerChange.RESTART" in text
    assert torch.equal(model.weight, before)
    assert opt.param_groups[0]["lr"] == 0.5 and not opt.state


def test_a_deliberate_switch_keeps_fresh_state_and_carries_the_learning_rate(
    tmp_path: Path,
) -> None:
    run = _saved(tmp_path)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sk.load(
        run, {"model": model, "opt": opt}, on_optimizer_change=sk.training.OptimizerChange.RESTART
    )
    group = opt.param_groups[0]
    assert group["lr"] == 0.01 and group["momentum"] == 0.9 and not opt.state
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # SGD's own hyper-parameters are intact: it steps


def test_old_checkpoints_without_a_class_are_checked_by_hyper_parameter_names(
    tmp_path: Path,
) -> None:
    model, opt = _trained(torch.optim.AdamW, lr=0.01)
    state = {"model": model, "opt": opt}
    captured = capture(state)
    captured["opt"].pop("class")  # as written before the class was recorded
    write_step(sk.storage.LocalStorage(tmp_path), captured, step=1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    with pytest.raises(sk.KeyMismatchError, match=r"betas.*does not use.*lacks.*momentum"):
        sk.load(tmp_path, {"model": model, "opt": sgd})
    same = torch.optim.AdamW(model.parameters(), lr=0.5)
    sk.load(tmp_path, {"model": model, "opt": same})  # the same class still loads
    assert same.param_groups[0]["lr"] == 0.01


def test_on_optimizer_change_must_be_the_enum(tmp_path: Path) -> None:
    run = _saved(tmp_path)
    model, opt = _trained(torch.optim.AdamW)
    with pytest.raises(sk.errors.InvalidArgumentError, match="OptimizerChange"):
        sk.load(run, {"model": model, "opt": opt}, on_optimizer_change="restart")


def test_a_class_from_the_training_script_matches_when_imported_later(tmp_path: Path) -> None:
    model, opt = _trained(torch.optim.AdamW, lr=0.01)
    captured = capture({"model": model, "opt": opt})
    captured["opt"]["class"] = "__main__.AdamW"  # saved by `python train.py`
    write_step(sk.storage.LocalStorage(tmp_path), captured, step=1)
    same = torch.optim.AdamW(model.parameters(), lr=0.5)
    sk.load(tmp_path, {"model": model, "opt": same})
    assert same.param_groups[0]["lr"] == 0.01
