"""``lightning``: each Lightning test run under both packages, ``pytorch_lightning`` and the
unified ``lightning`` (helpers started by the test train with the one named)."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from tests.helpers.lightning_pkg import PACKAGES, VARIABLE


@pytest.fixture(params=PACKAGES)
def lightning(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The ``Trainer`` package of this run of the test (``pl``), named to its helpers."""
    monkeypatch.setenv(VARIABLE, request.param)
    module = importlib.import_module(request.param)
    importlib.import_module(f"{request.param}.callbacks")
    importlib.import_module(f"{request.param}.plugins.io")
    return module
