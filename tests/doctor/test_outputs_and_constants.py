"""SK006 compares outputs as tensors wherever they sit; SK003 runs without an example input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from statekeeper.doctor.finding import Severity
from statekeeper.doctor.run import run


class Cache:
    """A cache object as language models return: plain attributes holding tensors."""

    def __init__(self, keys: list[torch.Tensor]) -> None:
        self.keys = keys


@dataclass
class Output:
    logits: torch.Tensor
    cache: Cache


class CachingNet(nn.Module):
    def __init__(self, hidden: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.hidden = hidden
        self.scale = float(torch.rand(()))  # state the state_dict misses (when used)

    def forward(self, x: torch.Tensor) -> Output:
        y = self.lin(x) * (self.scale if self.hidden else 1.0)
        return Output(y, Cache([y.detach() * 2, x]))


def caching() -> dict[str, Any]:
    return {"model": CachingNet(), "example_input": torch.randn(2, 4)}


def caching_hidden() -> dict[str, Any]:
    return {"model": CachingNet(hidden=True), "example_input": torch.randn(2, 4)}


def _rule(report: Any, rule: str) -> list[Any]:
    return [f for f in report.findings if f.rule == rule]


def test_outputs_in_dataclasses_and_cache_objects_are_compared_as_tensors() -> None:
    assert _rule(run(caching), "SK006") == []


def test_uncaptured_state_is_still_found_behind_a_dataclass_output() -> None:
    (finding,) = _rule(run(caching_hidden), "SK006")
    assert finding.severity is Severity.ERROR
    assert "output.logits" in finding.problem and "scale" in finding.problem


class Sampler(nn.Module):
    """A sampling grid built with meshgrid in __init__ and saved as a persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, 6), torch.linspace(-1, 1, 8), indexing="ij")
        self.register_buffer("grid", torch.stack([xs, ys], dim=-1).contiguous())
        self.conv = nn.Conv2d(2, 2, 1)
        self.norm = nn.BatchNorm2d(2)  # running stats start uniform: state, not a constant


def sampler_only() -> nn.Module:
    return Sampler()


def test_sk003_reports_a_likely_constant_without_an_example_input() -> None:
    report = run(sampler_only)
    (finding,) = _rule(report, "SK003")
    assert finding.severity is Severity.WARNING and finding.tensor == "grid"
    assert "unconfirmed" in finding.problem and "example_input" in finding.fix
    skipped = dict(report.skipped)
    assert "SK003" not in skipped
    assert "return {'model': model, 'example_input': x}" in skipped["SK006"]
