"""The storage protocol: bytes and names only (this package never imports torch).

A storage is rooted at one run directory holding *entries* (directories such as
``step_000001200``) that hold *files*. Writers go through a :class:`Transaction`:

1. ``storage.writer_lock()`` is held for as long as a writer may write (a second live
   writer on the same run directory gets ``WriterConflictError``);
2. ``storage.begin(entry)`` creates the in-progress entry ``<entry>.partial-<id>``;
3. ``txn.write(name, data)`` or ``txn.write_chunks(name, chunks)`` (large pieces, written in
   order, never joined in memory) for each file, each durable when it returns (fsync);
4. ``txn.commit()`` makes the directory durable, renames it to ``entry`` (the commit point)
   and makes the parent durable; ``txn.abort()`` removes the in-progress entry instead.

Readers call ``entries()``, ``files(entry)``, ``read(entry, name)`` and ``size(entry, name)``.
File names are single path components (:mod:`statekeeper.storage.files`); a backend opens
only regular files and raises ``CorruptCheckpointError`` for anything else.
``remove(entry)`` deletes a whole entry (retention, clean-up).

What a backend may do beyond this protocol (reusing a file without copying its bytes, telling
when two names are one stored copy, fingerprints, its :class:`Capabilities`) is in
:mod:`statekeeper.storage.optional`.
"""

from __future__ import annotations

import mmap
from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

__all__ = ["EntryWriter", "FileWriter", "SharedStorage", "Storage", "Transaction"]


@runtime_checkable
class FileWriter(Protocol):
    """Writes the files of one in-progress entry."""

    @property
    def entry(self) -> str:
        """The in-progress entry's name (``<final>.partial-<id>``)."""
        ...

    def write(self, name: str, data: bytes) -> None:
        """Write one file and make it durable."""
        ...

    def write_chunks(self, name: str, chunks: Iterable[bytes | memoryview]) -> None:
        """Write one file from pieces, in order, and make it durable."""
        ...


class EntryWriter(ABC):
    """What the backends' :class:`FileWriter` classes share: ``entry`` (the ``_entry`` they
    set) and ``write``, one piece of ``write_chunks`` (which each backend implements)."""

    _entry: str

    @property
    def entry(self) -> str:
        return self._entry

    def write(self, name: str, data: bytes) -> None:
        self.write_chunks(name, (data,))

    @abstractmethod
    def write_chunks(self, name: str, chunks: Iterable[bytes | memoryview]) -> None: ...


@runtime_checkable
class Transaction(FileWriter, Protocol):
    """One entry being written; invisible to readers until :meth:`commit`."""

    def commit(self) -> None:
        """Atomically publish the entry under its final name."""
        ...

    def abort(self) -> None:
        """Remove the in-progress entry."""
        ...


@runtime_checkable
class Storage(Protocol):
    """A run directory: entries of files, written through transactions.

    Two members are optional, so that a backend written for an earlier release keeps
    working: ``capabilities``, a :class:`~statekeeper.storage.optional.Capabilities` (absent:
    none; read it with :func:`~statekeeper.storage.optional.capabilities_of`), and
    ``exists()``, which a backend that declares ``directories`` must have (whether the run
    directory exists).
    """

    def describe(self, entry: str = "", name: str = "") -> str:
        """A human-readable location for messages (a path or URL).

        Args:
            entry: An entry (a step directory's name); ``""`` for the run directory.
            name: A file of ``entry``; ``""`` for the entry itself.

        Returns:
            The location as a path or URL.
        """
        ...

    def entries(self) -> list[str]:
        """Names of all entries in the run directory (committed or not), sorted.

        Returns:
            The entry names, sorted.

        Raises:
            StorageError: The storage cannot be listed.
        """
        ...

    def files(self, entry: str) -> list[str]:
        """Names of the files in ``entry``, sorted; ``FileNotFoundError`` if it is absent.

        Args:
            entry: The entry to list.

        Returns:
            The file names, sorted.

        Raises:
            FileNotFoundError: ``entry`` does not exist.
        """
        ...

    def read(self, entry: str, name: str) -> bytes | bytearray | mmap.mmap:
        """A file's bytes; a writable buffer (bytearray, copy-on-write mmap) where the backend
        can give one without a copy, so tensors can be views of it. ``FileNotFoundError`` if
        it is absent.

        Args:
            entry: The entry that holds the file.
            name: The file's name.

        Returns:
            The file's bytes (``bytes``, a ``bytearray`` or a copy-on-write ``mmap``).

        Raises:
            FileNotFoundError: The file does not exist.
        """
        ...

    def size(self, entry: str, name: str) -> int:
        """A file's size in bytes; ``FileNotFoundError`` if it is absent.

        Args:
            entry: The entry that holds the file.
            name: The file's name.

        Returns:
            The size in bytes.

        Raises:
            FileNotFoundError: The file does not exist.
        """
        ...

    def begin(self, entry: str, *, replace: bool = False) -> Transaction:
        """Start writing ``entry``; with ``replace`` the commit swaps out an existing one.

        Args:
            entry: The entry to write.
            replace: Whether the commit may swap out an existing committed entry.

        Returns:
            The :class:`Transaction` to write the files through, then commit or abort.
        """
        ...

    def remove(self, entry: str) -> None:
        """Delete an entry and all its files (no error if it is already gone).

        Atomic for readers: a committed entry stops being listed as committed before any of
        its files go (local: renamed to ``<entry>.removing-<id>`` first; object stores: the
        commit marker is removed first), so a kill mid-way never leaves a listed entry that
        lacks files.

        Args:
            entry: The entry to delete.
        """
        ...

    def writer_lock(self) -> AbstractContextManager[None]:
        """Exclusive right to write; raises ``WriterConflictError`` if a live writer holds it.

        Returns:
            A context manager holding the run directory's writer lock.

        Raises:
            WriterConflictError: A live writer holds the lock already.
        """
        ...


@runtime_checkable
class SharedStorage(Storage, Protocol):
    """A storage several processes can write one entry of (distributed saves).

    The process that called ``begin`` owns the transaction and alone commits or aborts it;
    the others ``attach`` to the in-progress entry by name and only write files into it.
    """

    def attach(self, entry: str) -> FileWriter:
        """Write files into the in-progress ``entry`` (``Transaction.entry`` of its owner).

        Args:
            entry: The in-progress entry, ``Transaction.entry`` of its owner.

        Returns:
            A writer of files into it (it neither commits nor aborts).
        """
        ...
