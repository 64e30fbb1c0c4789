"""The Lightning package a test helper trains with: ``pytorch_lightning`` or the unified
``lightning`` (``lightning.pytorch``), named by ``$STATEKEEPER_TEST_LIGHTNING`` (the tests
run each Lightning scenario under both; ``pytorch_lightning`` when unset)."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

__all__ = ["PACKAGES", "VARIABLE", "check_alone", "fabric", "trainer"]

VARIABLE = "STATEKEEPER_TEST_LIGHTNING"
PACKAGES = ("pytorch_lightning", "lightning.pytorch")
_FABRIC = {"pytorch_lightning": "lightning_fabric", "lightning.pytorch": "lightning.fabric"}


def _name() -> str:
    name = os.environ.get(VARIABLE, PACKAGES[0])
    assert name in PACKAGES, name
    return name


def trainer() -> ModuleType:
    """The ``Trainer`` package (``pl``), its ``callbacks`` and ``plugins.io`` imported."""
    module = importlib.import_module(_name())
    importlib.import_module(f"{_name()}.callbacks")
    importlib.import_module(f"{_name()}.plugins.io")
    return module


def fabric(of: str | None = None) -> ModuleType:
    """The Fabric package of the same Lightning (``lightning_fabric``, ``lightning.fabric``),
    or of the ``Trainer`` package named ``of``."""
    name = _FABRIC[of or _name()]
    importlib.import_module(f"{name}.plugins")
    return importlib.import_module(name)


def check_alone() -> None:
    """The other Lightning package was never imported: the run used this one's classes only."""
    other = {"pytorch_lightning": "lightning", "lightning.pytorch": "pytorch_lightning"}[_name()]
    assert other not in sys.modules, f"{other} was imported in a {_name()} run"
    if _name() == "pytorch_lightning":
        assert "lightning.fabric" not in sys.modules
    else:
        assert "lightning_fabric" not in sys.modules
