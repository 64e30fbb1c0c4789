"""``python -m statekeeper`` runs the same command as the ``statekeeper`` console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

import statekeeper as sk


def _python_m(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statekeeper", *map(str, args)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip


def test_python_m_statekeeper_lists_and_verifies_a_run(tmp_path: Path) -> None:
    sk.save(tmp_path, {"model": torch.nn.Linear(2, 2)}, step=3)
    listed = _python_m("ls", tmp_path, "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [c["step"] for c in json.loads(listed.stdout)["checkpoints"]] == [3]
    verified = _python_m("verify", tmp_path)
    assert verified.returncode == 0, verified.stderr[-2000:]
    assert "verified" in verified.stdout


def test_python_m_statekeeper_help_names_the_command() -> None:
    done = _python_m("--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Usage: statekeeper" in done.stdout
    assert sk.__version__ in _python_m("--version").stdout
