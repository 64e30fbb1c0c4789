"""``ls``, ``inspect`` and ``verify`` of statekeeper steps never import torch (or numpy).

Importing torch takes about 1-2 s; these commands need none of it, so they start in a
fraction of a second. Checked without any clock: the commands run in a child process in
which importing torch or numpy raises.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from tests.helpers.no_torch import REFUSE_TORCH

import statekeeper as sk

CHILD = (
    REFUSE_TORCH
    + r"""
from statekeeper.cli.main import main
main(sys.argv[1:])
"""
)


def _run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, args)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip


def test_ls_inspect_verify_and_help_never_import_torch(tmp_path: Path) -> None:
    tied = torch.nn.Linear(4, 4)
    sk.save(tmp_path, {"model": tied, "tied": tied.weight, "epoch": 3, "lr": 0.1}, step=5)
    step = tmp_path / "step_000000005"
    for args in (("ls", tmp_path), ("inspect", step), ("verify", tmp_path), ("--help",),
                 ("ls", tmp_path, "--json"), ("inspect", tmp_path, "--json")):  # fmt: skip
        done = _run(*args)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        assert "was imported" not in done.stderr
    assert "verified" in _run("verify", step).stdout


API_CHILD = (
    REFUSE_TORCH
    + r"""
import statekeeper as sk
run = sys.argv[1]
report = sk.audit.verify(run)
held = sk.audit.inspect(run)
partial = sk.audit.list_partial(run)
steps = sk.list_checkpoints(run)
print(report.ok, held.step, len(partial), [c.step for c in steps])
"""
)


def test_the_audit_namespace_reads_steps_without_torch(tmp_path: Path) -> None:
    """``sk.audit``'s verify, inspect and list_partial (and the root's list_checkpoints) of
    statekeeper steps, from Python: the namespace loads each name on first use, so touching
    ``sk.audit`` does not import ``diff`` (which needs torch)."""
    sk.save(tmp_path, {"model": torch.nn.Linear(2, 2), "epoch": 1}, step=3)
    done = subprocess.run(
        [sys.executable, "-c", API_CHILD, str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "3", "0", "[3]"]
