"""Running the framework integration helpers (``accelerate_run``, ``lightning_run``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import launcher

__all__ = ["oldest", "run_to_end"]


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


def oldest(extra: str, package: str) -> tuple[str, dict[str, str]]:
    """The floor of ``package`` in the pyproject extra ``extra`` (``>=5.0`` -> ``5.0.0``) and
    an environment whose ``PYTHONPATH`` puts that release, installed apart by scripts/setup,
    first."""
    import os
    import tomllib

    extras = tomllib.loads((launcher.ROOT / "pyproject.toml").read_text())["project"]
    specs = extras["optional-dependencies"][extra]
    spec = next(s for s in specs if s.startswith(f"{package}>="))
    floor = spec.split(">=")[1].split(",")[0]
    version = floor if floor.count(".") == 2 else f"{floor}.0"
    where = launcher.ROOT / ".venv" / f"{package}-{version}"
    assert (where / ".complete").is_file(), f"{where}: run scripts/setup, it installs it"
    return version, {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), str(launcher.ROOT)])}
