"""SK004 (transient tensors), SK005 (per-batch buffers), SK006 (uncaptured state)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Rule
from statekeeper.doctor.rules.batch_state import BatchState
from statekeeper.doctor.rules.transient_tensors import TransientTensors
from statekeeper.doctor.rules.uncaptured_state import UncapturedState
from statekeeper.doctor.run import run
from statekeeper.doctor.target import build_target


class Caching(nn.Module):
    """Keeps activations on self: last_out (new), cache (replaced), history (appended)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.const = torch.ones(4)  # a constant: SK003's business, not SK004's
        self.cache = torch.zeros(1)
        self.history: list[torch.Tensor] = []
        self.weight_ref = [self.lin.weight]  # a parameter alias: not transient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(x) * self.const
        self.last_out = out
        self.cache = out.detach().sum(0)
        self.history.append(out.detach())
        return out


class CachingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Caching()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.block(x)
        return out


class Membrane(nn.Module):
    """Per-batch state in persistent buffers: 'state' (value) and 'h' (shape follows batch)."""

    state: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("state", torch.zeros(1, 4))
        self.register_buffer("h", torch.zeros(1, 4))
        self.register_buffer("scratch", torch.zeros(1, 4), persistent=False)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.bn(self.lin(x)) + self.state
        self.state = x.mean(0, keepdim=True)
        self.h = x.detach().clone()
        self.scratch = x.sum(0, keepdim=True)
        return out


class NoisyTensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.noise = torch.randn(4)  # not a buffer: a fresh instance draws another one

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(x) + self.noise
        return out


class ScaledNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.Linear(4, 4))
        self.scale = random.random()  # a plain python attribute the state_dict leaves out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(x) * self.scale
        return out


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 8, batch_first=True)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        seq, (h, c) = self.rnn(x)
        return self.out(seq[:, -1]), (h, c)


class Dropping(nn.Module):
    """Random in eval mode from an unseeded source: the output is nondeterministic."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        gen = torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))
        out: torch.Tensor = self.lin(x) + torch.rand(4, generator=gen)
        return out


def caching() -> dict[str, Any]:
    return {"model": CachingNet(), "example_input": torch.randn(2, 4)}


def membrane() -> dict[str, Any]:
    return {"model": Membrane(), "example_input": torch.randn(2, 4)}


def noisy_tensor() -> dict[str, Any]:
    return {"model": NoisyTensor(), "example_input": torch.randn(2, 4)}


def scaled() -> dict[str, Any]:
    return {"model": ScaledNet(), "example_input": lambda: torch.randn(2, 4)}


def dropping() -> dict[str, Any]:
    return {"model": Dropping(), "example_input": torch.randn(2, 4)}


def mlp() -> dict[str, Any]:
    model = nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 2)
    )
    return {"model": model, "example_input": torch.randn(2, 4)}


def recurrent() -> dict[str, Any]:
    return {"model": Recurrent(), "example_input": torch.randn(2, 3, 4)}


def _findings(factory: Any, rule: Rule) -> list[Finding]:
    return list(run(factory, rules=(rule,)).findings)


def _rng_states() -> tuple[torch.Tensor, Any, list[int]]:
    numpy_state = np.random.get_state(legacy=False)["state"]
    return torch.random.get_rng_state(), random.getstate(), numpy_state["key"].tolist()


def test_sk004_reports_tensors_forward_leaves_on_modules() -> None:
    found = _findings(caching, TransientTensors())
    assert {(f.rule, f.where, f.tensor) for f in found} == {
        ("SK004", "block", "last_out"),
        ("SK004", "block", "cache"),
        ("SK004", "block", "history"),
    }
    by_name = {f.tensor: f for f in found}
    assert all(f.severity is Severity.WARNING for f in found)
    assert by_name["last_out"].shape == (2, 4)
    assert by_name["last_out"].bytes == 2 * 4 * 4
    assert "autograd graph" in by_name["last_out"].problem
    assert by_name["cache"].shape == (4,)
    assert by_name["history"].bytes == 2 * (2 * 4 * 4)  # one tensor per forward, train + eval
    assert "persistent=False" in by_name["cache"].fix


def test_sk005_reports_persistent_buffers_that_follow_the_batch() -> None:
    found = _findings(membrane, BatchState())
    assert {(f.rule, f.where, f.tensor) for f in found} == {
        ("SK005", "model", "state"),
        ("SK005", "model", "h"),
    }
    by_name = {f.tensor: f for f in found}
    assert all(f.severity is Severity.ERROR for f in found)
    assert by_name["h"].shape == (2, 4)
    assert "(1, 4) -> (2, 4)" in by_name["h"].problem
    assert by_name["state"].shape == (1, 4)
    assert by_name["state"].bytes == 16


@pytest.mark.parametrize(("factory", "attribute"), [(noisy_tensor, "noise"), (scaled, "scale")])
def test_sk006_reports_state_the_state_dict_leaves_out(factory: Any, attribute: str) -> None:
    (finding,) = _findings(factory, UncapturedState())
    assert (finding.rule, finding.severity, finding.where) == ("SK006", Severity.ERROR, "model")
    assert finding.tensor == "output"
    assert finding.shape == (2, 4)
    suspects = finding.problem.split("probably held by ")[1]
    assert suspects.startswith(f"{attribute} (")
    assert "get_extra_state" in finding.fix


def test_sk006_names_submodule_attributes() -> None:
    def nested() -> dict[str, Any]:
        return {"model": nn.Sequential(NoisyTensor()), "example_input": torch.randn(2, 4)}

    (finding,) = _findings(nested, UncapturedState())
    assert "probably held by 0.noise (" in finding.problem


def test_sk006_warns_when_the_output_is_nondeterministic() -> None:
    (finding,) = _findings(dropping, UncapturedState())
    assert (finding.rule, finding.severity) == ("SK006", Severity.WARNING)
    assert "nondeterministic" in finding.problem


@pytest.mark.parametrize("factory", [mlp, recurrent])
@pytest.mark.parametrize("rule", [TransientTensors(), BatchState(), UncapturedState()])
def test_clean_models_have_no_findings(factory: Any, rule: Rule) -> None:
    target = build_target(factory)
    before = _rng_states()
    assert _findings(target, rule) == []
    after = _rng_states()
    assert torch.equal(before[0], after[0])
    assert before[1:] == after[1:]


@pytest.mark.parametrize("rule", [TransientTensors(), BatchState(), UncapturedState()])
def test_rules_restore_every_rng(rule: Rule) -> None:
    for factory in (caching, membrane, scaled):
        target = build_target(factory)
        before = _rng_states()
        run(target, rules=(rule,))
        after = _rng_states()
        assert torch.equal(before[0], after[0])
        assert before[1:] == after[1:]


def test_a_factory_returning_the_same_model_is_skipped_with_info() -> None:
    shared = Membrane()

    def same() -> dict[str, Any]:
        return {"model": shared, "example_input": torch.randn(2, 4)}

    state = {k: v.clone() for k, v in shared.state_dict().items()}
    for rule in (TransientTensors(), BatchState(), UncapturedState()):
        (finding,) = _findings(same, rule)
        assert finding.severity is Severity.INFO
    assert all(torch.equal(v, shared.state_dict()[k]) for k, v in state.items())


def test_train_mode_failure_falls_back_to_eval() -> None:
    def single() -> dict[str, Any]:
        return {"model": CachingNet(), "example_input": torch.randn(1, 4)}

    def single_bn() -> dict[str, Any]:
        return {"model": mlp()["model"], "example_input": torch.randn(1, 4)}

    assert {f.tensor for f in _findings(single, TransientTensors())} == {
        "last_out",
        "cache",
        "history",
    }
    assert _findings(single_bn, TransientTensors()) == []
    assert _findings(single_bn, UncapturedState()) == []
