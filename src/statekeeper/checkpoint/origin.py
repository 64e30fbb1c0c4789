"""Where a step comes from: the library versions and the origin recorded in its manifest.

``library`` (always written): statekeeper, torch, Python and numpy versions, and CUDA and
cuDNN when torch was built with them. ``origin`` (the manifest's optional member): the
host, the command line, the world size and device kinds, and the git commit of the
working tree the script ran from, with a dirty flag. Everything is read cheaply and never
fails a save: what cannot be read is left out. The git state is read once per process.

How much ``origin`` records is an :class:`Origin` level: the save's ``origin=`` argument,
else the environment variable ``STATEKEEPER_ORIGIN``, else ``Origin.REDACTED`` (everything,
with secret-looking command-line values replaced: :mod:`statekeeper.checkpoint.redact`).
"""

from __future__ import annotations

import functools
import os
import platform
import re
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from statekeeper._version import __version__
from statekeeper.checkpoint.origin_level import Origin
from statekeeper.checkpoint.redact import redact_argv
from statekeeper.errors import StatekeeperWarning, user_stacklevel
from statekeeper.lanes import lane

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


def _text(value: object) -> str:
    """``value`` as text any strict JSON reader takes: bytes a name could not be decoded
    from (lone surrogates) become backslash escapes."""
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = os.fsencode(text).decode("utf-8", "backslashreplace")
    return text


def _command(redact: bool) -> list[str]:
    """The command line (its secrets redacted first when ``redact``), each argument cut to
    what is left of 2000 characters (so the program name always stays), with ``[cut]``
    where arguments were left out."""
    kept: list[str] = []
    room = _ARGV_CHARS
    args = [_text(a) for a in sys.argv]
    for arg in redact_argv(args) if redact else args:
        if room <= 0:
            return [*kept, "[cut]"]
        kept.append(arg if len(arg) <= room else arg[:room] + "[cut]")
        room -= len(arg)
    return kept


def _devices() -> list[str]:
    kinds = ["cpu"]
    if torch.cuda.is_available():
        kinds.append(f"cuda x{torch.cuda.device_count()}")
    return kinds


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _git(*args: str, cwd: Path) -> str | None:
    # no optional locks: git status must not rewrite the user's index (or hold its lock
    # while the user commits); the environment's GIT_DIR & co. do not redirect it
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_OPTIONAL_LOCKS"] = "0"
    try:
        done = subprocess.run(
            ["git", "--no-optional-locks", *args], cwd=cwd, capture_output=True,
            timeout=_GIT_SECONDS, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", "replace").strip()


def _git_dir(start: Path) -> Path | None:
    """The ``.git`` directory of the working tree holding ``start`` (a worktree's or a
    submodule's ``.git`` file followed)."""
    for folder in (start, *start.parents):
        dot = folder / ".git"
        if dot.is_dir():
            return dot
        if dot.is_file():
            text = dot.read_text(errors="replace").strip()
            if text.startswith("gitdir:"):
                return (folder / text.split(":", 1)[1].strip()).resolve()
    return None


def _head(gitdir: Path) -> str | None:
    """The commit HEAD names, read from the files (no git process): a detached hash, a
    loose ref, or a line of ``packed-refs``."""
    head = (gitdir / "HEAD").read_text(errors="replace").strip()
    if not head.startswith("ref: "):
        return head
    ref = head[5:].strip()
    common = gitdir
    if (gitdir / "commondir").is_file():
        common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    for base in (gitdir, common):
        if (base / ref).is_file():
            return (base / ref).read_text(errors="replace").strip()
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(errors="replace").splitlines():
            if line.endswith(" " + ref):
                return line.split(" ", 1)[0]
    return None


_dirty: dict[str, bool] = {}
_dirty_lock = threading.Lock()


def _read_dirty(where: str) -> None:
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=Path(where))
    if status is not None:
        with _dirty_lock:
            _dirty[where] = bool(status)


@functools.cache
def _commit_of(where: str) -> str | None:
    """HEAD's commit of the working tree holding ``where``, read from its files (a few
    reads, once per process); the dirty flag is read by ``git status`` on the ``git``
    lane, handed to it here, so that no save waits for it."""
    gitdir = _git_dir(Path(where))
    commit = _head(gitdir) if gitdir is not None else None
    if not commit or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
        return None
    lane("git").submit(_read_dirty, where)  # not a thread of its own: see statekeeper/lanes.py
    return commit


def _git_state(where: str) -> dict[str, Any]:
    """The commit and, once ``git status`` has answered (within two seconds, on the ``git``
    lane), the dirty flag of the working tree holding ``where``; empty without one."""
    commit = _commit_of(where)
    if commit is None:
        return {}
    state: dict[str, Any] = {"commit": commit}
    with _dirty_lock:
        if where in _dirty:
            state["dirty"] = _dirty[where]
    return state


def _script_dir() -> str:
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main and Path(main).is_file():
        return str(Path(main).resolve().parent)
    return str(Path.cwd())


def _field(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:  # a field that cannot be read is left out: never a failed save
        return None


def origin(level: Origin = Origin.REDACTED) -> dict[str, Any]:
    """Where this process is, as much as ``level`` records: host, command line, world size,
    devices, git state; a field that cannot be read is left out."""
    if level is Origin.NONE:
        return {}
    personal = level is not Origin.MINIMAL
    found = {
        "hostname": _field(lambda: _text(socket.gethostname())) if personal else None,
        "argv": _field(lambda: _command(level is Origin.REDACTED)) if personal else None,
        "world_size": _field(_world_size),
        "devices": _field(_devices),
        "git": _field(lambda: _git_state(_script_dir()) or None),
    }
    return {k: v for k, v in found.items() if v is not None}


_warned: set[tuple[tuple[int, ...] | None, tuple[int, ...] | None]] = set()


def _feature_release(version: str) -> tuple[int, ...] | None:
    parts = _release(version).split(".")[:2]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        return None


def warn_if_other_torch(library: Mapping[str, str], where: str) -> None:
    """A ``StatekeeperWarning``, once per pair of versions in a process, when the step at
    ``where`` was written by another torch feature release (2.4 and 2.13: numerics and
    state-dict layouts move between them). A version that is not one (a pinned "golden", a
    local build's name) says nothing and never warns."""
    saved = library.get("torch")
    live = _release(torch.__version__)
    pair = (_feature_release(saved or ""), _feature_release(live))
    if None in pair or pair[0] == pair[1] or pair in _warned:
        return
    _warned.add(pair)
    warnings.warn(
        f"{where} was saved by torch {saved} and is loaded by torch {live}: numerics and "
        "state-dict layouts can differ between torch releases; compare a resumed run with "
        "the original (statekeeper.testing) before trusting it bit for bit",
        StatekeeperWarning,
        stacklevel=user_stacklevel(),
    )
