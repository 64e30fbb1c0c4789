"""Turning a URL into a storage: ``file://`` is local, anything else goes through fsspec."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from statekeeper.storage.base import Storage
from statekeeper.storage.fsspec import FsspecStorage
from statekeeper.storage.local import LocalStorage

__all__ = ["is_url", "storage_for_url"]


def is_url(value: str) -> bool:
    """``"s3://bucket/run"`` and ``"file:///tmp/run"`` are URLs; plain paths are not."""
    scheme, sep, _ = value.partition("://")
    return bool(sep) and scheme.isidentifier()


def storage_for_url(url: str) -> Storage:
    """``file://`` URLs get the crash-safe :class:`LocalStorage` (fsync, atomic rename); other
    schemes (``memory://``, ``s3://``, ``gs://``, ...) an :class:`FsspecStorage`, which commits
    by writing the manifest last."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return LocalStorage(unquote(parts.netloc + parts.path))
    return FsspecStorage(url)
