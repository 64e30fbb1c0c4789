"""Shared fixtures: small deterministic models and states; cheap child interpreters."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests.helpers import launcher
from tests.helpers.s3 import S3Server

LAUNCHING_LIBRARY_MODULES = ("statekeeper.testing", "statekeeper.doctor.rules.registration_order")
"""Library modules that start Python children with ``subprocess``: in the tests, their
children are forked from pre-started interpreters (tests/helpers/launcher.py), unless a test
is marked ``fresh_interpreters``."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fresh_interpreters: the library's children start as new interpreters, not forked "
        "from the tests' pre-started ones (tests/helpers/launcher.py)",
    )


@pytest.fixture(autouse=True)
def _forked_children(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("fresh_interpreters"):
        return
    for name in LAUNCHING_LIBRARY_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # broken or moved: the tests that use it say so themselves
            continue
        if hasattr(module, "subprocess"):
            monkeypatch.setattr(module, "subprocess", launcher.subprocess)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """An S3-compatible server on localhost (moto's, through s3fs), one per test module."""
    started = S3Server()
    yield started
    started.stop()


def lora_state(
    seed: int = 0, width: int = 256
) -> tuple[dict[str, Any], torch.nn.Module, torch.optim.Optimizer]:
    """A frozen ``base`` (its own shards) and a trainable ``adapter`` with Adam: the state,
    the adapter, the optimizer."""
    torch.manual_seed(seed)
    base = torch.nn.Linear(width, width)
    base.requires_grad_(False)
    adapter = torch.nn.Linear(width, 4)
    model = torch.nn.ModuleDict({"base": base, "adapter": adapter})
    opt = torch.optim.Adam(adapter.parameters(), lr=0.01)
    return {"model": model, "optim": opt}, adapter, opt


def lora_step(adapter: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """One training step of the adapter."""
    adapter(torch.randn(2, adapter.in_features)).sum().backward()
    opt.step()
    opt.zero_grad()


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def trained(seed: int = 0, steps: int = 2) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = make_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.ones(3, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt
