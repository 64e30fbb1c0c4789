"""A run directory on any fsspec file system (``s3://``, ``gs://``, ``memory://``, ...).

Object stores have no atomic rename of a directory, so this storage never renames: a
transaction writes its files straight into the entry's final location, and the *commit
marker* (``manifest.json``, the file statekeeper writes last) makes the entry committed.
An entry without its marker is an interrupted save: :meth:`FsspecStorage.entries` reports
it as ``<entry>.partial-0`` so that listings, loads and retention never read it, and
``remove_partial`` deletes it. Each file is written in one ``open(..., "wb")`` stream; the
stores this targets make an object visible only once its upload completes, so a marker is
either complete or absent.

Limits, compared with :class:`~statekeeper.storage.local.LocalStorage`:
- the writer lock is held for this process only: object stores give no portable exclusive
  lock, so keep one writing job per run directory;
- ``begin(entry, replace=True)`` first copies the committed entry aside, by the store
  (:mod:`statekeeper.storage.store_replace`): readers find that copy while the new version
  is written, and recovery puts it back after a crash; an overwrite costs that copy.

``fsspec`` is an optional dependency (``pip install statekeeper[fsspec]``; ``[s3]`` and
``[gcs]`` add the ``s3fs``/``gcsfs`` back-ends).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from statekeeper.errors import (
    CorruptCheckpointError,
    StatekeeperError,
    StorageError,
    WriterConflictError,
)
from statekeeper.storage.base import EntryWriter
from statekeeper.storage.files import check_name
from statekeeper.storage.optional import Capabilities
from statekeeper.storage.store_clients import bounded_options, filesystem
from statekeeper.storage.store_errors import Produced, guarded, translated
from statekeeper.storage.store_replace import recover, set_aside

__all__ = ["INCOMPLETE", "FsspecStorage"]

INCOMPLETE = ".partial-0"
"""Suffix under which an entry without its commit marker is reported."""


class _FsspecFiles(EntryWriter):
    """Writes files into one entry; with ``owner`` it may also commit or abort it."""

    def where(self, name: str = "", *_: Any) -> str:
        return self._storage.describe(self._final, name)

    def __init__(
        self, storage: FsspecStorage, final: str, owner: bool, aside: str | None = None
    ) -> None:
        self._storage = storage
        self._final = final
        self._owner = owner
        self._aside = aside  # the old copy an overwrite set aside: superseded at the commit
        self._done = False
        self._entry = final + INCOMPLETE

    @translated("writing")
    def write_chunks(self, name: str, chunks: Iterable[bytes | memoryview]) -> None:
        path = self._storage.path(self._final, name)
        try:
            with self._storage.fs.open(path, "wb") as f:
                for chunk in guarded(chunks):
                    f.write(memoryview(chunk).cast("B"))
        except Produced:
            raise
        except OSError as exc:
            raise StorageError(exc.errno, f"could not write {path}: {exc}") from exc

    @translated("copying into")
    def reuse(self, name: str, entry: str, source: str) -> bool:
        """A copy made by the store itself (S3 ``CopyObject``, GCS rewrite, ...); False
        where the file system has no copy of its own."""
        src, target = self._storage.path(entry, source), self._storage.path(self._final, name)
        try:
            self._storage.fs.copy(src, target)
        except NotImplementedError:
            return False
        except OSError as exc:
            raise StorageError(exc.errno, f"could not copy {src} to {target}: {exc}") from exc
        return True

    @translated("committing")
    def commit(self) -> None:
        if not self._owner:
            raise StorageError(None, f"{self.entry}: only the transaction that began it commits")
        marker = self._storage.path(self._final, self._storage.marker)
        if not self._storage.fs.exists(marker):
            raise StorageError(None, f"cannot commit {marker}: the commit marker was not written")
        self._done = True
        if self._aside is not None:  # superseded; a leftover cleaned up later if this fails
            with suppress(StorageError, FileNotFoundError):
                self._storage.remove(self._aside)

    def abort(self) -> None:
        """Remove what was written, as far as the store lets it now: an entry left behind
        has no commit marker, is listed as partial and never read (``remove_partial``).
        The copy an overwrite set aside stays: it is the committed entry until recovery
        (``restore_latest``, ``remove_partial``) puts it back."""
        if self._owner and not self._done:
            self._done = True
            with suppress(StorageError, FileNotFoundError):
                self._storage.remove(self._final)


class FsspecStorage:
    """Entries are "directories" (key prefixes) under ``url``; see :mod:`statekeeper.storage.base`.

    ``storage_options`` go to the fsspec file system (credentials, endpoint, ...).

    Args:
        url: The run directory's URL (``s3://bucket/run``, ``gs://...``).
        marker: The file whose presence commits an entry.
        **storage_options: Options of the fsspec file system (credentials, endpoint...).
    """

    capabilities = Capabilities(local_reads=False, directories=False)  # a read is a download

    def __init__(self, url: str, *, marker: str = "manifest.json", **storage_options: Any) -> None:
        self.url = url.rstrip("/") + ("//" if url.rstrip("/").endswith(":") else "")
        self.marker = marker
        self.options = dict(storage_options)
        self.fs, self.root = filesystem(url, storage_options)
        self._mutex = threading.Lock()
        self._depth = 0
        self._exclusive = False  # held by one save alone (exclusive_writer_lock)

    def where(self, entry: str = "", name: str = "", *_: Any) -> str:
        return self.describe(entry, name) if isinstance(entry, str) else self.describe()

    def path(self, entry: str = "", name: str = "") -> str:
        return "/".join(p for p in (self.root, entry, name) if p)

    def describe(self, entry: str = "", name: str = "") -> str:
        rest = "/".join(p for p in (entry, name) if p)
        if self.url.endswith("://") or not rest:
            return self.url + rest
        return f"{self.url}/{rest}"

    def _real(self, entry: str) -> str:
        return entry.removesuffix(INCOMPLETE)

    def with_timeout(self, seconds: float) -> FsspecStorage:
        """This run directory through a client of its own whose every request gives up after
        ``seconds`` without progress (to connect, and between two reads of an answer) and is
        tried once (the caller retries). Applied to s3fs (``s3://``): botocore's
        ``connect_timeout``/``read_timeout``, its retries and s3fs's own off. Other back-ends
        keep the timeouts given in their ``storage_options``: this storage itself
        (:mod:`statekeeper.storage.store_clients`).

        Args:
            seconds: How long a request may go without progress before it gives up.

        Returns:
            A new ``FsspecStorage`` of the same run directory with those timeouts (s3fs), or
            this storage itself for any other back-end.
        """
        options = bounded_options(self.fs, self.options, seconds)
        if options is None:
            return self
        bounded = FsspecStorage(self.url, marker=self.marker, **options)
        bounded.fs.retries = 1  # s3fs's own retry loop: one try
        return bounded

    @translated("looking for")
    def exists(self) -> bool:
        self.fs.invalidate_cache()  # what the store holds now, never a listing cached before
        return bool(self.fs.exists(self.root))

    @translated("listing")
    def entries(self) -> list[str]:
        """One flat listing of everything under the run directory (an object store pages it,
        1,000 keys a request), never served from the file system's listing cache: what
        another process committed since is seen, and a prefix that is no step (other files
        beside the run) costs its share of that listing only, never a request of its own."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.root, withdirs=True, detail=True)
        except FileNotFoundError:
            return []
        prefix = self.root + "/"
        names: set[str] = set()
        marked: set[str] = set()
        for path, info in found.items():
            path = str(path).rstrip("/")
            if not path.startswith(prefix):
                continue
            head, _, rest = path[len(prefix) :].partition("/")
            if not head:
                continue
            if not rest and info.get("type") == "directory":
                names.add(head)
            elif rest == self.marker:  # whatever it is: reading it says what is wrong
                names.add(head)
                marked.add(head)
        return sorted(n if n in marked else n + INCOMPLETE for n in names)

    @translated("listing")
    def top_level(self) -> list[str]:
        """The names of the entries directly under the run directory, from one listing of
        that level only (an object store's delimited listing: a page per 1,000 names,
        whatever the entries hold), never served from a cache. Unlike :meth:`entries` it
        does not say which are committed: :meth:`is_committed` asks, one request an entry,
        for the entries a caller needs (the newest step, on a resume).

        Returns:
            The names of the directories directly under the run directory, sorted (none when
            it does not exist).

        Raises:
            StorageError: The store could not be listed.
        """
        self.fs.invalidate_cache(self.root)
        try:
            listed = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        names = (str(i["name"]).rstrip("/").rsplit("/", 1)[-1] for i in listed)
        kinds = (i.get("type") for i in listed)
        return sorted(n for n, kind in zip(names, kinds, strict=True) if kind == "directory")

    @translated("looking for")
    def is_committed(self, entry: str) -> bool:
        """Whether ``entry`` holds its commit marker now (one request, never cached).

        Args:
            entry: The entry to ask about (a name :meth:`entries` reports with the
                ``.partial-0`` suffix is asked under its name without it).

        Returns:
            True when the entry's commit marker exists.

        Raises:
            StorageError: The store could not be asked.
        """
        marker = self.path(self._real(entry), self.marker)
        self.fs.invalidate_cache(marker)
        return bool(self.fs.exists(marker))

    @translated("listing")
    def files(self, entry: str) -> list[str]:
        base = self.path(self._real(entry))
        self.fs.invalidate_cache(base)
        if not self.fs.isdir(base):
            raise FileNotFoundError(self.describe(entry))
        listed = self.fs.ls(base, detail=True)
        return sorted(
            str(i["name"]).rstrip("/").rsplit("/", 1)[-1] for i in listed if i.get("type") == "file"
        )

    @translated("reading the size of")
    def _info(self, entry: str, name: str, fresh: bool = False) -> dict[str, Any]:
        """The object's description, refused unless it is a plain file (an object; on a
        local file system a regular file that is no link): a FIFO never blocks a read."""
        real = self._real(entry)
        check_name(self.describe(real), name)
        path = self.path(real, name)
        if fresh:
            self.fs.invalidate_cache(path)  # not a listing cached before the file changed
        info: dict[str, Any] = self.fs.info(path)
        kind = info.get("type")
        if kind != "file" or info.get("islink"):
            what = "a symbolic link" if info.get("islink") else f"of type {kind!r}"
            raise CorruptCheckpointError(
                self.describe(real, name),
                f"is {what}, not a regular file; statekeeper opens only regular files",
            )
        return info

    def fingerprint(self, entry: str, name: str) -> object | None:
        """The object's ETag (a new one with every write) where the store gives one.

        Args:
            entry: The entry that holds the file.
            name: The file's name.

        Returns:
            ``(ETag, size)``, or None when the store gives no ETag or the file cannot be
            described (absent, unreachable, not a regular file).
        """
        try:
            info = self._info(entry, name, fresh=True)
        except (OSError, StatekeeperError):
            return None
        tag = info.get("ETag") or info.get("etag")
        return None if tag is None else (str(tag), info.get("size"))

    @translated("reading")
    def read(self, entry: str, name: str) -> bytes:
        self._info(entry, name)
        data = self.fs.cat_file(self.path(self._real(entry), name))
        return bytes(data)

    def size(self, entry: str, name: str) -> int:
        return int(self._info(entry, name)["size"])

    @translated("beginning")
    def begin(self, entry: str, *, replace: bool = False) -> _FsspecFiles:
        base = self.path(entry)
        aside = None
        if self.fs.exists(base):
            if self.is_committed(entry):
                if not replace:
                    raise StorageError(None, f"{self.describe(entry)} is committed already")
                aside = set_aside(self, entry)  # committed before the old copy is touched
            self.remove(entry)  # an interrupted earlier save, or the step being replaced
        return _FsspecFiles(self, entry, owner=True, aside=aside)

    def recover(self) -> list[str]:
        """Under the writer lock: put back the entries an interrupted overwrite set aside
        (:func:`statekeeper.storage.store_replace.recover`).

        Returns:
            The names of the entries put back.
        """
        return recover(self)

    def attach(self, entry: str) -> _FsspecFiles:
        """Write files into the in-progress ``entry`` that another process began."""
        return _FsspecFiles(self, self._real(entry), owner=False)

    @translated("removing")
    def remove(self, entry: str) -> None:
        real = self._real(entry)
        marker = self.path(real, self.marker)
        try:
            if self.fs.exists(marker):
                self.fs.rm_file(marker)  # uncommit first: a half-removed step is never read
            if self.fs.exists(self.path(real)):
                self.fs.rm(self.path(real), recursive=True)
        except FileNotFoundError:
            pass

    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Held by this object, re-entered freely (a Checkpointer holds it, its saves take it
        again), and released by whichever thread ends the write (a background save).
        Object stores have no portable lock, so nothing excludes another process.

        Returns:
            A context manager holding this object's writer lock.

        Raises:
            WriterConflictError: One save alone holds it (:meth:`exclusive_writer_lock`).
        """
        with self._mutex:
            if self._exclusive:
                raise _same_object(self.describe())
            self._depth += 1
        try:
            yield
        finally:
            with self._mutex:
                self._depth -= 1

    @contextmanager
    def exclusive_writer_lock(self) -> Iterator[None]:
        """The writer lock for one save alone (``statekeeper.save``): refused while this
        object holds it already, and not re-entered while held, so that one object never
        runs two saves, or a clean-up beside a save, at once. Another process is still not
        excluded (object stores have no portable lock).

        Returns:
            A context manager holding this object's writer lock alone.

        Raises:
            WriterConflictError: This object's writer lock is held already.
        """
        with self._mutex:
            if self._depth:
                raise _same_object(self.describe())
            self._depth, self._exclusive = 1, True
        try:
            yield
        finally:
            with self._mutex:
                self._depth, self._exclusive = 0, False


def _same_object(where: str) -> WriterConflictError:
    return WriterConflictError(
        f"{where} is being written through the same storage object: a save through it is "
        "still running, or a Checkpointer on it is open; wait for that save "
        "(PendingSave.wait()) or close the Checkpointer first"
    )
