"""Where a step comes from: the library versions and the origin recorded in its manifest.

``library`` (always written): statekeeper, torch, Python and numpy versions, and CUDA and
cuDNN when torch was built with them. ``origin`` (the manifest's optional member): the
host, the command line, the world size and device kinds, and the git commit of the
working tree the script ran from, with a dirty flag. Everything is read cheaply and never
fails a save: what cannot be read is left out. The git state is read once per process.
"""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from statekeeper._version import __version__
from statekeeper.errors import StatekeeperWarning, user_stacklevel

__all__ = ["library_versions", "origin", "warn_if_other_torch"]

_ARGV_CHARS = 2000  # a command line longer than that is cut (with a marker)
_GIT_SECONDS = 2.0


def _release(version: str) -> str:
    return version.split("+")[0]


def library_versions() -> dict[str, str]:
    """The versions that write a step."""
    versions = {
        "statekeeper": __version__,
        "torch": _release(torch.__version__),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    cuda = getattr(torch.version, "cuda", None)
    if cuda:
        versions["cuda"] = str(cuda)
        try:
            cudnn = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
        except (RuntimeError, AttributeError):
            cudnn = None
        if cudnn:
            versions["cudnn"] = str(cudnn)
    return versions


def _command() -> list[str]:
    argv = [str(a) for a in sys.argv]
    if sum(len(a) for a in argv) <= _ARGV_CHARS:
        return argv
    kept: list[str] = []
    for arg in argv:
        if sum(len(a) for a in kept) + len(arg) > _ARGV_CHARS:
            return [*kept, "..."]
        kept.append(arg)
    return kept


def _devices() -> list[str]:
    kinds = ["cpu"]
    try:
        if torch.cuda.is_available():
            kinds.append(f"cuda x{torch.cuda.device_count()}")
    except RuntimeError:
        pass
    return kinds


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _git(*args: str, cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=_GIT_SECONDS,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def _git_state(where: str) -> dict[str, Any]:
    """The commit (and a dirty flag) of the git working tree holding ``where``; empty when
    there is none, git is missing, or it does not answer within two seconds."""
    cwd = Path(where)
    commit = _git("rev-parse", "HEAD", cwd=cwd)
    if not commit:
        return {}
    state: dict[str, Any] = {"commit": commit}
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=cwd)
    if status is not None:
        state["dirty"] = bool(status)
    return state


def _script_dir() -> str:
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return str(Path(main).resolve().parent) if main else str(Path.cwd())


def origin() -> dict[str, Any]:
    """Where this process is: host, command line, world size, devices, git state."""
    found: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "argv": _command(),
        "world_size": _world_size(),
        "devices": _devices(),
    }
    git = _git_state(_script_dir())
    if git:
        found["git"] = git
    return found


_warned: set[tuple[str, str]] = set()


def _feature_release(version: str) -> tuple[int, ...] | None:
    parts = _release(version).split(".")[:2]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        return None


def warn_if_other_torch(library: Mapping[str, str], where: str) -> None:
    """A ``StatekeeperWarning``, once per pair of versions in a process, when the step at
    ``where`` was written by another torch feature release (2.4 and 2.13: numerics and
    state-dict layouts move between them)."""
    saved = library.get("torch")
    live = _release(torch.__version__)
    if not saved or _feature_release(saved) == _feature_release(live) or (saved, live) in _warned:
        return
    _warned.add((saved, live))
    warnings.warn(
        f"{where} was saved by torch {saved} and is loaded by torch {live}: numerics and "
        "state-dict layouts can differ between torch releases; compare a resumed run with "
        "the original (statekeeper.testing) before trusting it bit for bit",
        StatekeeperWarning,
        stacklevel=user_stacklevel(),
    )
