"""Whether two storages are the same run directory, however each was spelled.

A local directory is known by its resolved path (``run/../run``, a symbolic link to it and
``file:///abs/run`` all resolve alike) and, where it exists, by its device and inode (a bind
mount); an fsspec store by its protocol, its endpoint and its normalized root. Two storages
of kinds this cannot compare are taken as different.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from statekeeper.storage.fsspec import FsspecStorage
from statekeeper.storage.local import LocalStorage

__all__ = ["same_place"]

_LOCAL_PROTOCOLS = {"file", "local"}


def _protocols(fs: Any) -> frozenset[str]:
    found = fs.protocol
    return frozenset(found if isinstance(found, tuple | list) else (found,))


def _local_path(storage: object) -> str | None:
    if isinstance(storage, LocalStorage):
        return os.path.realpath(storage.root)
    if isinstance(storage, FsspecStorage) and _protocols(storage.fs) & _LOCAL_PROTOCOLS:
        return os.path.realpath(storage.root)
    return None


def _endpoint(storage: FsspecStorage) -> object:
    """The server an object store's client talks to, where its options name one."""
    client = storage.options.get("client_kwargs") or {}
    return storage.options.get("endpoint_url") or client.get("endpoint_url")


def _same_directory(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): the resolved paths decided
        return False


def same_place(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` are one run directory (``a is b`` included)."""
    if a is b:
        return True
    local_a, local_b = _local_path(a), _local_path(b)
    if local_a is not None or local_b is not None:
        return local_a is not None and local_b is not None and _same_directory(local_a, local_b)
    if isinstance(a, FsspecStorage) and isinstance(b, FsspecStorage):
        if not _protocols(a.fs) & _protocols(b.fs) or _endpoint(a) != _endpoint(b):
            return False
        return posixpath.normpath("/" + a.root) == posixpath.normpath("/" + b.root)
    return False
