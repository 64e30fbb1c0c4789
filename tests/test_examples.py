"""The examples run and reach their claims (the README's demo among them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.helpers import launcher

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("script", "claim"),
    [
        ("examples/demo.py", "bitwise identical"),
        ("examples/kill_during_save.py", "removed the interrupted save: step_000000300.partial-"),
        ("examples/lightning_resume.py", "resumed run's weights are bitwise identical"),
        pytest.param(
            "examples/distributed.py",
            "rank 1: losses after resume are bitwise identical",
            marks=pytest.mark.xdist_group("gloo"),
        ),
    ],
)
def test_example_runs_and_makes_its_claim(script: str, claim: str) -> None:
    done = launcher.run(  # forked with torch imported, and so are the example's own children
        [sys.executable, script], cwd=ROOT, capture_output=True, text=True, timeout=300,
        check=False, fork_children=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert claim in " ".join(done.stdout.split())
