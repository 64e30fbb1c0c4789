"""Foreign checkpoints for the interop tests (see formats.py for who writes each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.interop import formats


@pytest.fixture(scope="session")
def lightning(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A real Lightning .ckpt after one training step, and its module's state_dict."""
    return formats.lightning_ckpt(tmp_path_factory.mktemp("lightning") / "last.ckpt")


@pytest.fixture(scope="session")
def accelerate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A real Accelerator.save_state folder, and the state it saved."""
    return formats.accelerate_folder(tmp_path_factory.mktemp("accelerate") / "state")
