"""Run-directory paths that cannot work, said before (or instead of) a bare ``OSError``.

- :func:`checked_path`: an empty path (which would mean the current directory), a path
  holding a NUL byte and a name longer than the file system allows are refused up front;
- :func:`writer_lock`: the run directory's writer lock, whose failures to create the
  directory or the lock file (a read-only file system, no permission, a parent that is a
  regular file, no space) become a :class:`~statekeeper.errors.StorageError` that keeps the
  errno and names the directory and the fix.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from statekeeper.errors import InvalidArgumentError, StatekeeperError, StorageError
from statekeeper.storage.base import Storage
from statekeeper.storage.optional import exclusive_lock_of

__all__ = ["checked_path", "writer_lock"]

_NAME_MAX = 255
_PATH_MAX = 4096


def _limit(path: Path, name: str, default: int) -> int:
    """``os.pathconf`` of the nearest existing ancestor of ``path`` (``default`` if unknown)."""
    for parent in (path, *path.parents):
        try:
            return os.pathconf(parent, name)
        except (OSError, ValueError):
            continue
    return default


def checked_path(directory: str | os.PathLike[str]) -> str:
    """``directory`` as a str, refused when it is empty or a part of it is too long."""
    text = os.fspath(directory)
    if not isinstance(text, str):
        raise InvalidArgumentError(
            f"the directory {directory!r} is a bytes path: pass it as a str or a pathlib.Path"
        )
    if text == "":
        raise InvalidArgumentError(
            "the directory is '' (empty), which would be the current directory: pass the run "
            "directory's path (or '.' to mean the current directory)"
        )
    if "\0" in text:
        raise InvalidArgumentError(
            f"the directory {text[:80]!r} holds a NUL byte, which no file name may hold: pass "
            "the path without it (often a C string or a file read with a trailing NUL)"
        )
    path = Path(text)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > _NAME_MAX and size > _limit(path, "PC_NAME_MAX", _NAME_MAX):
            shown = part if len(part) <= 40 else f"{part[:37]}..."
            raise StorageError(
                errno.ENAMETOOLONG,
                f"{shown!r} in the directory path {text[:80]!r}... is {size} bytes long, longer "
                "than the file system allows for one name: use a shorter directory name",
            )
    if len(os.fsencode(text)) > _PATH_MAX:
        raise StorageError(
            errno.ENAMETOOLONG,
            f"the directory path {text[:80]!r}... is longer than {_PATH_MAX} bytes: use a "
            "shorter path",
        )
    return text


def _file_above(path: Path) -> Path | None:
    """The nearest ancestor of ``path`` that exists but is not a directory."""
    for parent in (path, *path.parents):
        if os.path.lexists(parent):
            return None if parent.is_dir() else parent
    return None


def _fix(exc: OSError, where: str) -> str:
    if exc.errno == errno.EROFS:
        return (
            f"{where} is on a read-only file system, so nothing can be saved there: save to a "
            "writable directory (or remount it read-write); loading its steps still works"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"{where}: permission denied ({exc.strerror}): save to a directory this user may "
            "write, or change its permissions"
        )
    if exc.errno == errno.ENOTDIR:
        above = _file_above(Path(where))
        what = f"{above} is a regular file" if above is not None else "a parent is not a folder"
        return (
            f"{where} cannot be a run directory: {what}, and a directory cannot be made under "
            "a file; pass a path whose parents are directories"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{where}: no space left ({exc.strerror}): free space there, or save elsewhere"
    return f"{where}: {exc.strerror or exc}: check the path and its file system"


class writer_lock:
    """``storage.writer_lock()``; an ``OSError`` taking it becomes a ``StorageError`` with
    the same errno, naming the directory and the fix. Errors raised while it is held pass
    through unchanged."""

    def __init__(self, storage: Storage, *, exclusive: bool = False) -> None:
        self._storage = storage
        self._exclusive = exclusive  # one save alone: see storage.optional.exclusive_lock_of
        self._held: Any = None

    def __enter__(self) -> None:
        take = exclusive_lock_of(self._storage) if self._exclusive else None
        held = (take or self._storage.writer_lock)()
        try:
            held.__enter__()
        except StatekeeperError:
            raise
        except OSError as exc:
            raise StorageError(exc.errno, _fix(exc, self._storage.describe())) from exc
        self._held = held

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        held, self._held = self._held, None
        return None if held is None else held.__exit__(exc_type, exc, tb)
