"""statekeeper's AveragedModel and torch's exchange state dicts strictly, both ways."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.optim.swa_utils import AveragedModel as TorchAveraged
from torch.optim.swa_utils import get_ema_multi_avg_fn

import statekeeper as sk


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))


def _trained_average(average: torch.nn.Module, model: torch.nn.Module, updates: int) -> None:
    for i in range(updates):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * (i + 1))
        average.update_parameters(model)


def test_torch_state_loads_strictly_into_ours_and_continues_identically() -> None:
    model = _model()
    theirs = TorchAveraged(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    _trained_average(theirs, model, 3)
    ours = sk.averaging.AveragedModel(_model(), multi_avg_fn=get_ema_multi_avg_fn(0.9))
    ours.load_state_dict(theirs.state_dict())  # strict: no n_calls in torch's
    assert int(ours.n_calls) == 3 and int(ours.n_averaged) == 3
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name
    twin = _model()
    twin.load_state_dict(model.state_dict())
    _trained_average(theirs, model, 2)
    _trained_average(ours, twin, 2)  # the same source updates, on an identical copy
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name


def test_ours_exports_a_state_torch_loads_strictly() -> None:
    model = _model()
    ours = sk.averaging.AveragedModel(model, rule=sk.averaging.EMA(0.9))
    _trained_average(ours, model, 4)
    theirs = TorchAveraged(_model())
    theirs.load_state_dict(ours.torch_state_dict())  # strict: no unexpected n_calls
    assert int(theirs.n_averaged) == int(ours.n_averaged)
    for name, value in theirs.module.state_dict().items():
        assert torch.equal(ours.module.state_dict()[name], value), name


def test_counters_follow_the_rule_when_derived() -> None:
    average = sk.averaging.AveragedModel(
        _model(), rule=sk.averaging.EMA(0.9, update_after_step=5, every=2)
    )
    state = average.torch_state_dict()
    state["n_averaged"] = torch.tensor(3)
    average.load_state_dict(state)
    assert int(average.n_calls) == 5 + 2 * 2 + 1
    state["n_averaged"] = torch.tensor(0)
    average.load_state_dict(state)
    assert int(average.n_calls) == 0


def test_torch_state_loads_through_statekeeper_and_inside_other_modules(tmp_path: Path) -> None:
    model = _model()
    theirs = TorchAveraged(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    _trained_average(theirs, model, 3)
    sk.save(tmp_path, {"ema": theirs}, step=1)  # a step saved before switching to ours
    ours = sk.averaging.AveragedModel(_model(), multi_avg_fn=get_ema_multi_avg_fn(0.9))
    sk.load(tmp_path, {"ema": ours})  # strict: n_calls is derived, not missing
    assert int(ours.n_calls) == 3 and int(ours.n_averaged) == 3
    holder = torch.nn.ModuleDict({"ema": sk.averaging.AveragedModel(_model())})
    holder.load_state_dict({f"ema.{k}": v for k, v in theirs.state_dict().items()})
    inner = holder["ema"]
    assert int(inner.n_calls) == 3
    before = inner.module[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    inner.update_parameters(model)  # goes on from 3 averaged: a running mean, not a first copy
    expected = before + (model[0].weight.detach() - before) / 4
    torch.testing.assert_close(inner.module[0].weight.detach(), expected)
    assert int(inner.n_averaged) == 4
