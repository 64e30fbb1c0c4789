"""Publishing, setting aside and restoring entries of a local run directory by rename.

At every instant each committed entry has one complete copy that readers find:

- a new entry is published by one ``rename(partial, entry)``: the commit point;
- an entry saved again (``overwrite=True``) is published by one atomic exchange,
  ``renameat2(partial, entry, RENAME_EXCHANGE)`` (Linux, on file systems that have it): the
  old copy and the new one swap names in one step, so ``entry`` is always a complete copy;
  the old copy, now under the partial name, is then renamed to ``.removing-<id>`` and
  deleted;
- where there is no exchange (another kernel, NFS, some FUSE file systems: ``EINVAL``,
  ``ENOSYS``, ``EOPNOTSUPP``) the old copy is first renamed to ``<entry>.replaced-<id>``,
  then the new one to ``entry``. Between the two renames the set-aside copy *is* the
  committed entry: every reader (``committed`` in ``catalog/location.py``) takes a
  ``.replaced-`` entry whose ``entry`` does not exist as that entry, and :func:`recover`
  (run under the writer lock by ``restore_latest`` and ``remove_partial``) renames it back.
  Once ``entry`` exists, a ``.replaced-`` copy of it is superseded and is deleted.

No path here deletes the only complete copy of a committed entry: only a superseded copy or
an uncommitted one goes. :func:`set_aside` renames a committed entry to
``<entry>.<label>-<id>`` (a damaged step a restarted run saves again), kept as evidence.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from statekeeper.errors import StorageError
from statekeeper.storage.files import fsync_dir

__all__ = [
    "DAMAGED",
    "PARTIAL",
    "REMOVING",
    "REPLACED",
    "commit_entry",
    "discard",
    "exchange",
    "recover",
    "set_aside",
]

PARTIAL = ".partial-"
"""Infix of an entry being written: ``<entry>.partial-<id>``."""
REMOVING = ".removing-"
"""Infix of an entry being deleted: ``<entry>.removing-<id>``."""
REPLACED = ".replaced-"
"""Infix of a committed entry an overwrite set aside (the committed copy while ``<entry>``
does not exist; superseded once it does)."""
DAMAGED = ".damaged-"
"""Infix of a damaged step a restarted run set aside to save that step again (evidence:
never read, never deleted by statekeeper)."""

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_NO_EXCHANGE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    """libc's ``renameat2`` (glibc 2.28 and later, Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


_RENAMEAT2 = _renameat2()


def exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` (both exist) atomically; False where the kernel or
    the file system cannot (nothing changed then)."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _aside(root: Path, entry: str, infix: str) -> Path:
    return root / f"{entry}{infix}{uuid.uuid4().hex[:12]}"


def _base(name: str, infix: str) -> str | None:
    """``X`` of ``X<infix><id>``, or None when ``name`` is not such a name."""
    base, found, rest = name.rpartition(infix)
    return base if found and base and rest else None


def discard(root: Path, name: str) -> None:
    """Delete the uncommitted or superseded entry ``name``: renamed to ``.removing-`` first
    (so that a kill mid-way leaves a name that says what it is), then its files."""
    path = root / name
    base = next((b for i in (PARTIAL, REPLACED) if (b := _base(name, i)) is not None), None)
    if base is not None:
        doomed = _aside(root, base, REMOVING)
        try:
            os.rename(path, doomed)
            path = doomed
        except FileNotFoundError:
            return
        except OSError:
            pass  # deleted under its own name then
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _superseded(root: Path, entry: str) -> list[str]:
    """The ``.replaced-`` copies of ``entry`` (superseded once ``entry`` exists)."""
    prefix = f"{entry}{REPLACED}"
    try:
        return sorted(n for n in os.listdir(root) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def _failed(final: Path, exc: OSError) -> StorageError:
    return StorageError(exc.errno, f"could not commit {final}: {exc.strerror or exc}")


def commit_entry(root: Path, partial: str, entry: str, *, replace: bool) -> None:
    """Publish the complete, durable ``root/partial`` as ``root/entry`` (see the module
    docstring); with ``replace`` an existing ``entry`` is swapped out and deleted."""
    source, final = root / partial, root / entry
    if replace and final.exists():
        try:
            swapped = exchange(source, final)
        except OSError as exc:
            raise _failed(final, exc) from exc
        if swapped:  # the commit point; the partial name now holds the old copy
            fsync_dir(root)
            discard(root, partial)
            for name in _superseded(root, entry):
                discard(root, name)
            return
        aside = _aside(root, entry, REPLACED)
        try:
            os.rename(final, aside)  # from here the set-aside copy is the committed one
        except OSError as exc:
            raise _failed(final, exc) from exc
    try:
        os.rename(source, final)  # the commit point
    except OSError as exc:
        recover(root)  # the set-aside copy back under its name, if one was set aside
        raise _failed(final, exc) from exc
    fsync_dir(root)  # durable before any older copy goes
    for name in _superseded(root, entry):
        discard(root, name)


def recover(root: Path) -> list[str]:
    """Rename every set-aside committed copy (``X.replaced-<id>`` where no ``X`` exists)
    back to its name, durably; the names restored. Call it under the writer lock."""
    restored = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    present = set(names)
    for name in names:
        base = _base(name, REPLACED)
        if base is None or base in present:
            continue
        os.rename(root / name, root / base)
        present.add(base)
        restored.append(base)
    if restored:
        fsync_dir(root)
    return restored


def set_aside(root: Path, entry: str, label: str) -> str:
    """Rename the committed ``entry`` to ``<entry>.<label>-<id>`` durably (it stops being
    committed; its files stay); the new name."""
    aside = _aside(root, entry, f".{label}-")
    try:
        os.rename(root / entry, aside)
        fsync_dir(root)
    except OSError as exc:
        raise StorageError(
            exc.errno, f"could not set {root / entry} aside as {aside.name}: {exc.strerror}"
        ) from exc
    return aside.name
