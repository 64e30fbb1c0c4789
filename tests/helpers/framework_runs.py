"""Running the framework integration helpers (``accelerate_run``, ``lightning_run``)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.helpers import launcher

__all__ = ["run_to_end"]


def run_to_end(module: str, where: Path, out: Path, every: int, kill: int, *more: str) -> int:
    """Run ``tests.helpers.<module>`` to its end (0) or to the SIGKILL it sends itself (-9)."""
    args = [sys.executable, "-m", f"tests.helpers.{module}", str(where), str(out)]
    done = launcher.run(
        [*args, str(every), str(kill), *more], cwd=launcher.ROOT, capture_output=True, text=True
    )
    assert done.returncode in (0, -9), done.stderr
    return done.returncode
