"""Exact batch order after resume, for every loader setup, at every stop position."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import launcher

ROOT = Path(__file__).resolve().parents[2]


def _run(mode: str, directory: Path, workers: int, hash_seed: int) -> dict[str, Any]:
    done = launcher.run(  # forked from an interpreter started with this PYTHONHASHSEED
        [sys.executable, "-m", "tests.helpers.loader_order", mode, str(directory), str(workers)],
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize("workers", [0, 2])
def test_every_stop_position_resumes_the_same_batches_in_a_fresh_process(
    tmp_path: Path, workers: int
) -> None:
    full = _run("save", tmp_path, workers, hash_seed=1)
    resumed = _run("resume", tmp_path, workers, hash_seed=2)
    assert set(full) == set(resumed)
    for setup, sequence in full.items():
        runs = resumed[setup]
        assert len(runs) == len(sequence) + 1  # stops after 0, 1, ..., all batches
        assert len(sequence) >= 15  # three epochs of 5 or 6 batches
        for k, rest in enumerate(runs):
            assert rest == sequence[k:], f"{setup}, {workers} workers, stopped after batch {k}"
