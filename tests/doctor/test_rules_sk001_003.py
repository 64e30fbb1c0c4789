"""SK001 (memory overlap), SK002 (registration order), SK003 (derived constant buffers).

The models live at module level: SK002 imports its factory in subprocesses as
``tests.doctor.test_rules_sk001_003:<factory>``, from the repository root.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rules import registration_order
from statekeeper.doctor.rules.derived_constant import DerivedConstant
from statekeeper.doctor.rules.overlap import MemoryOverlap
from statekeeper.doctor.rules.registration_order import RegistrationOrder
from statekeeper.doctor.run import run
from statekeeper.doctor.target import build_target
from statekeeper.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parents[2]
SPEC = "tests.doctor.test_rules_sk001_003"
SET_NAMES = ("w_alpha", "w_beta", "w_gamma", "w_delta", "w_eps")


def mlp() -> dict[str, Any]:
    """Clean for every rule: deterministic registration, BatchNorm's running stats change."""
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return {"model": model, "optimizer": opt, "example_input": torch.randn(5, 8)}


def mlp_module() -> nn.Module:
    """The same MLP without an optimizer (building one costs a subprocess seconds)."""
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


# SK001 -----------------------------------------------------------------------------------


class Grid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("anchors", torch.zeros(1, 8).expand(4, 8))  # stride 0
        xs, _ = torch.meshgrid(torch.arange(3.0), torch.arange(5.0), indexing="ij")
        self.register_buffer("coords", xs)  # meshgrid: a stride-0 view
        self.register_buffer("scale", torch.ones(8))  # its own memory
        self.register_buffer("scratch", torch.zeros(1).expand(6), persistent=False)  # not loaded


class OverlapNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = Grid()
        self.out = nn.Linear(8, 2)


def overlap_model() -> nn.Module:
    return OverlapNet()


def test_sk001_reports_every_overlapping_tensor_confirmed_by_a_fresh_load() -> None:
    target = build_target(overlap_model)
    rng = torch.get_rng_state()
    findings = run(target, rules=(MemoryOverlap(),)).findings
    assert torch.equal(torch.get_rng_state(), rng)  # the fresh build drew from a forked RNG
    assert [f.tensor for f in findings] == ["head.anchors", "head.coords"]
    anchors, coords = findings
    assert (anchors.rule, anchors.severity, anchors.where) == ("SK001", Severity.ERROR, "head")
    assert (anchors.shape, anchors.bytes) == ((4, 8), 4 * 8 * 4)
    assert (coords.shape, coords.bytes, coords.severity) == ((3, 5), 3 * 5 * 4, Severity.ERROR)
    assert "fails" in anchors.problem and "single memory location" in anchors.problem
    assert ".clone()" in anchors.fix and "statekeeper.load" in anchors.fix


def test_sk001_clean_model() -> None:
    assert run(mlp, rules=(MemoryOverlap(),)).findings == ()


# SK002 -----------------------------------------------------------------------------------


class SetRegistered(nn.Module):
    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        for name in set(shapes):  # the hazard: hash order of strings
            self.register_parameter(name, nn.Parameter(torch.zeros(shapes[name])))


class SetNet(nn.Module):
    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        self.stem = nn.Linear(3, 3)
        self.blocks = SetRegistered(shapes)


def _with_optimizer(model: nn.Module) -> dict[str, Any]:
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3)}


def set_model() -> dict[str, Any]:
    """Same-shaped parameters in set order: a positional resume silently shuffles."""
    return _with_optimizer(SetNet(dict.fromkeys(SET_NAMES, (3,))))


def set_model_shapes() -> dict[str, Any]:
    """Differently shaped parameters in set order: a positional resume crashes."""
    return _with_optimizer(SetNet({n: (i + 1,) for i, n in enumerate(SET_NAMES)}))


def _sk002(factory: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Finding, ...]:
    monkeypatch.chdir(ROOT)
    return run(factory, rules=(RegistrationOrder(),), spec=f"{SPEC}:{name}").findings


def test_sk002_same_shapes_shuffle_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    (finding,) = _sk002(set_model, "set_model", monkeypatch)
    assert (finding.rule, finding.severity, finding.where) == ("SK002", Severity.ERROR, "blocks")
    assert finding.tensor in {f"blocks.{n}" for n in SET_NAMES}
    assert finding.shape == (3,)
    assert "silently" in finding.problem and "crash" not in finding.problem
    assert "stem.weight" not in finding.problem  # only the names that move are listed
    assert "sorted(" in finding.fix


def test_sk002_different_shapes_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    (finding,) = _sk002(set_model_shapes, "set_model_shapes", monkeypatch)
    assert (finding.rule, finding.severity, finding.where) == ("SK002", Severity.ERROR, "blocks")
    assert finding.tensor in {f"blocks.{n}" for n in SET_NAMES}
    assert "would crash" in finding.problem and "silently" not in finding.problem


def test_sk002_clean_model(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _sk002(mlp_module, "mlp_module", monkeypatch) == ()


@pytest.mark.fresh_interpreters  # forked builds could finish within the 0.01 s limit
def test_sk002_timeout_is_inconclusive_and_says_how_to_allow_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STATEKEEPER_DOCTOR_TIMEOUT", "0.01")
    (finding,) = _sk002(mlp_module, "mlp_module", monkeypatch)
    assert (finding.rule, finding.severity) == ("SK002", Severity.WARNING)
    assert finding.problem.startswith("inconclusive") and "took over 0.01 s" in finding.problem
    assert "STATEKEEPER_DOCTOR_TIMEOUT" in finding.problem
    assert registration_order.TIMEOUT_S >= 600  # the default survives a loaded machine
    monkeypatch.setenv("STATEKEEPER_DOCTOR_TIMEOUT", "soon")
    with pytest.raises(InvalidArgumentError, match="STATEKEEPER_DOCTOR_TIMEOUT"):
        _sk002(mlp_module, "mlp_module", monkeypatch)


# SK003 -----------------------------------------------------------------------------------


class Encoder(nn.Module):
    steps: torch.Tensor
    proj: torch.Tensor
    window: torch.Tensor
    table: torch.Tensor
    ids: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        pos = torch.arange(4.0)[:, None] * torch.arange(8.0)[None, :]
        self.register_buffer("table", torch.sin(pos))  # derived constant: reported
        self.register_buffer("ids", torch.arange(8))  # integer constant: reported
        self.register_buffer("proj", torch.randn(8, 8))  # differs per seed: state
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))  # counts: state
        self.register_buffer("mask", torch.ones(8, dtype=torch.bool))  # bool: skipped
        self.register_buffer("window", torch.hann_window(8), persistent=False)  # not saved
        self.frozen = nn.Parameter(torch.ones(8), requires_grad=False)
        self.register_buffer("frozen_alias", self.frozen.detach())  # a parameter's alias

    def forward(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
        if self.training:
            self.steps.add_(1)
        y = self.bn(self.lin(x) @ self.proj) * self.window + self.table.sum() + self.frozen
        return "tag", y[:, self.ids]  # the loss is the first tensor of the output


class EncoderNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = Encoder()

    def forward(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
        out: tuple[str, torch.Tensor] = self.enc(x)
        return out


def constant_model() -> dict[str, Any]:
    random.random(), np.random.rand()  # a factory that draws from every global generator
    net = EncoderNet()
    return {"model": net, "example_input": lambda: torch.randn(6, 8)}


def _rng_states() -> tuple[bytes, object, bytes, int]:
    numpy = np.random.get_state(legacy=False)["state"]
    torch_state = torch.get_rng_state().numpy().tobytes()
    return torch_state, random.getstate(), numpy["key"].tobytes(), int(numpy["pos"])


def test_sk003_reports_constant_buffers_only() -> None:
    target = build_target(constant_model)
    states = _rng_states()
    report = run(target, rules=(DerivedConstant(),))
    assert _rng_states() == states  # builds and the training step drew from forked generators
    assert [f.tensor for f in report.findings] == ["enc.table", "enc.ids"]
    table, ids = report.findings
    assert (table.rule, table.severity, table.where) == ("SK003", Severity.WARNING, "enc")
    assert (table.shape, table.bytes) == ((4, 8), 4 * 8 * 4)
    assert (ids.shape, ids.bytes) == ((8,), 8 * 8)
    assert "persistent=False" in table.fix and "'table'" in table.fix


def test_sk003_clean_model() -> None:
    assert run(mlp, rules=(DerivedConstant(),)).findings == ()


def test_sk003_leaves_the_target_model_alone() -> None:
    target = build_target(constant_model)
    assert target.model is not None
    target.model.eval()
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    assert len(run(target, rules=(DerivedConstant(),)).findings) == 2
    assert not any(m.training for m in target.model.modules())
    after = target.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
