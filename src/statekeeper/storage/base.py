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

A writer may also have ``reuse(name, entry, source)`` (optional: :func:`reuser_of`): the
file ``name`` of the in-progress entry becomes the committed ``entry``'s file ``source``
without its bytes passing through this process: a hard link on a local file system (the
data stays alive while any entry names it; removing one entry never damages another), a
server-side copy on an object store. It returns False where the backend cannot do that
here (the caller then writes the file). A writer whose backend can open the source once
and link that very file also has ``reuse_checked(name, entry, source, check)``
(:func:`checked_reuser_of`): ``check`` looks at the opened source (:class:`Opened`: its
fingerprint, its bytes) and the link is made only when it returns True, so that what is
linked is what was checked, whatever is put at the source's name meanwhile.

A storage may also have ``identity(entry, name)`` (optional: :func:`identity_of`): the same
value for two names of one stored copy (local hard links), so that a damage to one is a
damage to both; a backend whose reuse makes an independent copy (an object store's copy)
has none.

A storage may also have ``fingerprint(entry, name)`` (optional: :func:`fingerprint_of`):
something that changes whenever the file's bytes are replaced or rewritten in place (local:
device, inode, size and modification time; an object store: its ETag), or None when it
cannot say. Incremental saves trust a file they checked before while it is unchanged.

Backends differ in what a read costs and in whether a run directory exists apart from its
entries; each says so in its :class:`Capabilities` (:func:`capabilities_of`), and callers
ask it, never the backend's class.
"""

from __future__ import annotations

import mmap
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Capabilities",
    "CheckedReuse",
    "Opened",
    "capabilities_of",
    "checked_reuser_of",
    "identity_of",
    "EntryWriter",
    "FileWriter",
    "Reuse",
    "SharedStorage",
    "Storage",
    "Transaction",
    "fingerprint_of",
    "reuser_of",
]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do cheaply or at all, beyond the protocol every backend keeps.

    ``local_reads``: ``read`` maps a file of this machine (the page cache, no download and
    no copy until a page is written), so reading a file before it is known to be needed
    costs next to nothing and a large step can be streamed one file at a time. The restore
    path then starts checksumming a step's tensor files before its manifest is parsed, and
    offline averaging reads only such storages. Local: yes; object stores (a read is a
    download) and memory (bytes held by the process, nothing mapped): no.

    ``directories``: the run directory exists apart from its entries, so a run directory
    that does not exist is reported as such (a mistyped path) by :meth:`Storage.exists`,
    instead of being read as a run without checkpoints. Local: yes; object stores and memory:
    no (a prefix exists only through what is stored under it).
    """

    local_reads: bool = False
    directories: bool = False


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


class Reuse(Protocol):
    """A writer's optional ``reuse`` method (see the module docstring)."""

    def __call__(self, name: str, entry: str, source: str) -> bool: ...


class Opened(Protocol):
    """A stored file opened once, as ``reuse_checked`` shows it to its ``check``."""

    def fingerprint(self) -> object:
        """What ``Storage.fingerprint`` would say of this very file."""
        ...

    def chunks(self) -> Iterator[memoryview]:
        """Its bytes, front to back (each piece valid until the next is asked for)."""
        ...


class CheckedReuse(Protocol):
    """A writer's optional ``reuse_checked`` method (see the module docstring)."""

    def __call__(
        self, name: str, entry: str, source: str, check: Callable[[Opened], bool] | None
    ) -> bool: ...


def _optional(owner: object, method: str) -> Callable[..., Any] | None:
    """``owner``'s optional ``method``, or None where it has none (backends and writers
    written before the method existed)."""
    found = getattr(owner, method, None)
    return found if callable(found) else None


def checked_reuser_of(files: object) -> CheckedReuse | None:
    """``files.reuse_checked`` where the writer has one."""
    return _optional(files, "reuse_checked")


def reuser_of(files: object) -> Reuse | None:
    """``files.reuse`` where the writer has one (backends written earlier have not)."""
    return _optional(files, "reuse")


def _called(storage: object, method: str, entry: str, name: str) -> object | None:
    found = _optional(storage, method)
    return None if found is None else found(entry, name)


def identity_of(storage: object, entry: str, name: str) -> object | None:
    """``storage.identity(entry, name)`` where the backend has one, else None."""
    return _called(storage, "identity", entry, name)


def fingerprint_of(storage: object, entry: str, name: str) -> object | None:
    """``storage.fingerprint(entry, name)`` where the backend has one, else None."""
    return _called(storage, "fingerprint", entry, name)


def capabilities_of(storage: object) -> Capabilities:
    """What ``storage`` declares it can do (its ``capabilities``), or nothing special."""
    declared = getattr(storage, "capabilities", None)
    return declared if isinstance(declared, Capabilities) else Capabilities()


@runtime_checkable
class Storage(Protocol):
    """A run directory: entries of files, written through transactions.

    Two members are optional, so that a backend written for an earlier release keeps
    working: ``capabilities``, a :class:`Capabilities` (absent: none; read it with
    :func:`capabilities_of`), and ``exists()``, which a backend that declares
    ``directories`` must have (whether the run directory exists).
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
