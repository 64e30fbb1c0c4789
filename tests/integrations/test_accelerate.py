"""Accelerate saving through statekeeper: a run killed mid-way and resumed through
``load_state`` ends bitwise identical to a run that never stopped."""

from __future__ import annotations

import select
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from tests.helpers import launcher

import statekeeper as sk

RUN = [sys.executable, "-m", "tests.helpers.accelerate_run"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return launcher.run([*RUN, *args], cwd=launcher.ROOT, capture_output=True, text=True)


def test_a_killed_accelerate_run_resumes_bitwise(tmp_path: Path) -> None:
    straight = _run(str(tmp_path / "straight"), str(tmp_path / "straight.safetensors"))
    assert straight.returncode == 0, straight.stderr
    project = tmp_path / "killed"
    child = launcher.Popen(
        [*RUN, str(project), str(tmp_path / "unused.safetensors")],
        cwd=launcher.ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    while True:  # killed after step 8: step 6 is the newest committed
        ready, _, _ = select.select([child.stdout], [], [], 120)  # a hang guard only
        assert ready, "the run printed nothing in 120 s"
        if child.stdout.readline().strip() == "step 8":
            break
    child.kill()
    child.wait()
    run = project / "checkpoints"
    assert [i.step for i in sk.list_checkpoints(run)] == [3, 6]  # total_limit=2
    resumed = _run(str(project), str(tmp_path / "resumed.safetensors"), "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "step 7" in resumed.stdout and "step 1\n" not in resumed.stdout
    a = load_file(str(tmp_path / "straight.safetensors"))
    b = load_file(str(tmp_path / "resumed.safetensors"))
    assert a.keys() == b.keys() and any(k.startswith("adam/") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert sk.verify(run).ok  # what the framework saved is an ordinary statekeeper run
