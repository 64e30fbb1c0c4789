"""Running the framework integration helpers (``accelerate_run``, ``lightning_run``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import launcher

__all__ = ["run_to_end"]


def run_to_end(
    module: str, where: Path, out: Path, every: int, kill: int, *more: str,
    env: dict[str, str] | None = None,
) -> int:  # fmt: skip
    """Run ``tests.helpers.<module>`` to its end (0) or to the SIGKILL it sends itself (-9).
    With ``env`` (a whole environment) the child is a fresh interpreter, not a fork of the
    servers (which have the installed framework imported): for a ``PYTHONPATH`` that puts
    another release of it first."""
    args = [sys.executable, "-m", f"tests.helpers.{module}", str(where), str(out)]
    start = launcher.run if env is None else subprocess.run
    done = start(
        [*args, str(every), str(kill), *more],
        cwd=launcher.ROOT, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode in (0, -9), done.stderr
    return done.returncode
