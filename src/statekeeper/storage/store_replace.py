"""Overwriting a committed entry of an object store so that it always has a complete copy.

An object store has no rename, so an entry saved again (``begin(entry, replace=True)``) is
first copied, by the store itself (S3 ``CopyObject``: no byte passes through the process),
to ``<entry>.replaced-<id>`` (:data:`~statekeeper.storage.commit.REPLACED`), its commit
marker last; only once that copy is committed is ``entry`` uncommitted (its marker removed
first) and written anew. While ``entry`` has no marker, the set-aside copy *is* the
committed entry: every reader takes a committed ``.replaced-`` entry whose ``entry`` is not
committed as that entry (``committed`` in ``catalog/location.py``, as for the local
protocol of :mod:`statekeeper.storage.commit`). Once the new ``entry`` is committed the
copy is superseded and deleted. A process killed in between leaves the old step committed
and findable; :func:`recover` (``restore_latest`` and ``remove_partial``, under the writer
lock) copies it back to ``entry`` and deletes it.

The price: an overwrite on an object store costs a server-side copy of the old step first.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from statekeeper.storage.commit import REPLACED

__all__ = ["recover", "set_aside"]


class FsspecStorage(Protocol):
    """What this needs of :class:`statekeeper.storage.fsspec.FsspecStorage`."""

    fs: Any
    marker: str

    def path(self, entry: str = "", name: str = "") -> str: ...

    def files(self, entry: str) -> list[str]: ...

    def top_level(self) -> list[str]: ...

    def is_committed(self, entry: str) -> bool: ...

    def remove(self, entry: str) -> None: ...


def _copy_file(storage: FsspecStorage, source: str, target: str, name: str) -> None:
    src, dst = storage.path(source, name), storage.path(target, name)
    try:
        storage.fs.copy(src, dst)
    except NotImplementedError:  # a back-end without a copy of its own: through here
        storage.fs.pipe_file(dst, storage.fs.cat_file(src))


def _copy_entry(storage: FsspecStorage, source: str, target: str) -> None:
    """Copy every file of ``source`` to ``target``, the commit marker last."""
    names = storage.files(source)
    for name in [n for n in names if n != storage.marker]:
        _copy_file(storage, source, target, name)
    if storage.marker in names:
        _copy_file(storage, source, target, storage.marker)


def set_aside(storage: FsspecStorage, entry: str) -> str:
    """A committed copy of the committed ``entry`` under ``<entry>.replaced-<id>``; its
    name. ``entry`` itself is untouched."""
    aside = f"{entry}{REPLACED}{uuid.uuid4().hex[:12]}"
    _copy_entry(storage, entry, aside)
    return aside


def _base(name: str) -> str | None:
    base, found, rest = name.rpartition(REPLACED)
    return base if found and base and rest and "/" not in rest else None


def recover(storage: FsspecStorage) -> list[str]:
    """Put back each entry an interrupted overwrite left set aside (``entry`` without its
    marker, ``entry.replaced-<id>`` committed): the uncommitted ``entry`` is removed, the
    copy copied back (marker last) and then deleted. The entries put back."""
    restored: list[str] = []
    for name in storage.top_level():
        base = _base(name)
        if base is None or base in restored or storage.is_committed(base):
            continue
        if not storage.is_committed(name):
            continue  # an interrupted set-aside: a leftover, cleaned up as partial
        storage.remove(base)  # the new version, never committed
        _copy_entry(storage, name, base)
        storage.remove(name)  # superseded now: the marker goes first
        restored.append(base)
    return restored
