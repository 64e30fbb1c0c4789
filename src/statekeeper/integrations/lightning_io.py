"""``StatekeeperCheckpointIO``: every checkpoint Lightning (or Fabric) writes as a statekeeper
step, at a local path or a URL.

The file Lightning asks for (``epoch=1-step=300.ckpt``, ``last.ckpt``) becomes a directory
(or, for a URL such as ``s3://bucket/run/last.ckpt`` or ``memory://run/last.ckpt``, a prefix
on that URL's file system) holding one committed statekeeper step, numbered by the
checkpoint's ``global_step`` (Lightning), or by its ``step`` / ``global_step`` entry when it
holds one (Fabric's ``fabric.save(path, state)``; 0 otherwise).

Under Lightning's ``AsyncCheckpointIO`` the saves run on a thread while Lightning goes on,
and ``ModelCheckpoint`` may remove a checkpoint whose save is still being written (its
top-k bookkeeping): the removal waits for that save to commit, then removes it. A removal of
a checkpoint whose save has not started yet (queued behind another save) is remembered, and
that save is dropped when its turn comes.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from statekeeper.catalog.location import resolve_storage
from statekeeper.checkpoint.save import save
from statekeeper.checkpoint.scope import Scope
from statekeeper.errors import InvalidArgumentError, StorageError
from statekeeper.integrations.held import plain_tree
from statekeeper.integrations.lightning_roots import ByPackage, imported, settled
from statekeeper.interop.reading import read
from statekeeper.loop.retention import keep_only
from statekeeper.storage.base import Storage
from statekeeper.storage.fsspec import FsspecStorage
from statekeeper.storage.local import LocalStorage
from statekeeper.storage.urls import is_url, storage_for_url

__all__ = ["StatekeeperCheckpointIO", "step_of"]


def step_of(checkpoint: Mapping[str, Any]) -> int:
    """The step a checkpoint is numbered by: its ``global_step`` (Lightning's), else its
    ``step`` (a Fabric state's), when that is a non-negative int; else 0."""
    for key in ("global_step", "step"):
        value = checkpoint.get(key)
        if type(value) is int and value >= 0:
            return value
    return 0


def _checkpoint_ios() -> tuple[type, ...]:
    return tuple(
        importlib.import_module(f"{root}.plugins.io.checkpoint_io").CheckpointIO
        for root in imported(fabric=True)
    )


class StatekeeperCheckpointIO(ByPackage):
    """Lightning checkpoints as statekeeper steps (see the module docstring).

    ``storage_options`` are handed to fsspec for URLs (``s3://``: credentials, endpoint);
    a local path takes none. Made, it is a ``CheckpointIO`` of the Lightning package this
    process has imported (``lightning_fabric``, ``lightning.fabric``, or both:
    :mod:`statekeeper.integrations.lightning_roots`).
    """

    _lightning = staticmethod(_checkpoint_ios)

    def __init__(self, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise InvalidArgumentError(
                f"storage_options must be a dict of fsspec options, got "
                f"{type(storage_options).__name__}"
            )
        self.storage_options = dict(storage_options or {})
        self._lock = threading.Condition()
        self._writing: dict[str, int] = {}  # target -> saves of it in progress
        self._dropped: set[str] = set()  # removed before their save began (queued)
        self._threaded = False  # a save ran off the main thread (AsyncCheckpointIO)

    def _target(self, path: str | os.PathLike[str]) -> str:
        text = os.fspath(path)
        if is_url(text):
            return text.rstrip("/")
        return str(Path(text).absolute())

    def _storage(self, target: str) -> Storage:
        if is_url(target) and not target.startswith("file://"):
            return FsspecStorage(target, **self.storage_options)
        if self.storage_options:
            raise InvalidArgumentError(
                f"{target}: storage_options are for URLs (s3://...); a local path takes none"
            )
        return storage_for_url(target) if is_url(target) else resolve_storage(target)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike[str], storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise InvalidArgumentError(
                "StatekeeperCheckpointIO takes storage_options when it is made "
                "(StatekeeperCheckpointIO(storage_options={...})), not per save"
            )
        target = self._target(path)
        with self._lock:
            if threading.current_thread() is not threading.main_thread():
                self._threaded = True
            if target in self._dropped:  # removed while it waited its turn
                self._dropped.discard(target)
                return
            self._writing[target] = self._writing.get(target, 0) + 1
        try:
            step = step_of(checkpoint)
            storage = self._storage(target)
            # Lightning calls this on the global rank 0 alone: a local save, never a collective
            save(storage, plain_tree(checkpoint), step=step, overwrite=True, scope=Scope.LOCAL)
            keep_only(storage, step)  # a name saved again (last.ckpt) keeps one step
        finally:
            with self._lock:
                self._writing[target] -= 1
                if not self._writing[target]:
                    del self._writing[target]
                self._lock.notify_all()

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        target = self._target(path)
        loaded: dict[str, Any] = read(self._storage(target) if is_url(target) else Path(target))
        return loaded

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        target = self._target(path)
        with self._lock:
            while target in self._writing:  # being written on AsyncCheckpointIO's thread
                self._lock.wait()
            if self._threaded and not self._exists(target):
                self._dropped.add(target)  # its save is queued: dropped when it starts
                return
        self._remove(target)

    def _exists(self, target: str) -> bool:
        if is_url(target):
            fs, root = _filesystem(target, self.storage_options)
            return bool(fs.exists(root))
        return os.path.lexists(target)

    def _remove(self, target: str) -> None:
        """Remove the checkpoint ``target`` as the storage layer removes a step: a local
        directory is renamed to ``<name>.removing-<id>`` first (``LocalStorage.remove``: a
        kill mid-way leaves no half-deleted checkpoint under its name, which Lightning would
        resume from), a URL's steps are uncommitted first (``FsspecStorage.remove``); a
        failure is a ``StorageError`` naming the checkpoint and the fix."""
        try:
            if is_url(target) and not target.startswith("file://"):
                self._remove_url(target)
                return
            where = Path(target.removeprefix("file://"))
            if where.is_dir() and not where.is_symlink():
                LocalStorage(where.parent).remove(where.name)
            else:  # a file (a stock checkpoint) or a link: one unlink, atomic
                where.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(
                exc.errno,
                f"could not remove the Lightning checkpoint {target}: {exc}. Free it (a mount "
                "point, an immutable or read-only directory, another process holding it) and "
                "remove it by hand, or keep it (ModelCheckpoint(save_top_k=-1))",
            ) from exc

    def _remove_url(self, target: str) -> None:
        storage = FsspecStorage(target, **self.storage_options)
        for entry in storage.entries():  # each step uncommitted before its files go
            storage.remove(entry)
        fs, root = _filesystem(target, self.storage_options)
        if fs.exists(root):
            fs.rm(root, recursive=True)

    def teardown(self) -> None:
        with self._lock:
            self._dropped.clear()


def _filesystem(url: str, options: Mapping[str, Any]) -> tuple[Any, str]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **options)
    return fs, str(root).rstrip("/")


StatekeeperCheckpointIO = settled(StatekeeperCheckpointIO)  # type: ignore[misc]  # one package: its subclass
