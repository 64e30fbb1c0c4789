"""An in-memory run directory that models durability and can fail any operation.

Every primitive (make a directory, write a file, fsync a file, fsync a directory, rename,
remove) is one *operation*, counted in :attr:`MemoryStorage.operations`. With
``fail_at=k`` the k-th operation (0-based) raises :class:`InjectedFailure` instead of
running. :meth:`MemoryStorage.crash` then models a power loss: only what was made durable
survives (file bytes need a file fsync, a directory's names need a directory fsync, and a
rename in the run directory needs a fsync of the run directory).

Used by the test suite to prove that a save interrupted at any operation leaves no
committed step; useful to users for the same kind of test of their own code.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from statekeeper.errors import StorageError, WriterConflictError
from statekeeper.storage.base import EntryWriter
from statekeeper.storage.optional import Capabilities

__all__ = ["InjectedFailure", "MemoryStorage"]


class InjectedFailure(StorageError):
    """The failure a :class:`MemoryStorage` was told to inject."""


@dataclass
class _Dir:
    files: dict[str, bytes] = field(default_factory=dict)
    durable_files: dict[str, bytes] = field(default_factory=dict)
    durable_names: set[str] = field(default_factory=set)
    stamps: dict[str, int] = field(default_factory=dict)  # a new one for every write


_STAMPS = itertools.count(1)


class _MemoryTransaction(EntryWriter):
    def __init__(self, storage: MemoryStorage, final: str, replace: bool) -> None:
        self._storage = storage
        self._final = final
        self._replace = replace
        self._entry = f"{final}.partial-{uuid.uuid4().hex[:12]}"
        self._done = False
        storage._op("mkdir", self._entry)
        storage._live[self._entry] = _Dir()

    def write_chunks(self, name: str, chunks: Iterable[bytes | memoryview]) -> None:
        s = self._storage
        s._op("write", f"{self._entry}/{name}")
        d = s._live[self._entry]
        d.files[name] = b"".join(bytes(c) for c in chunks)
        d.stamps[name] = next(_STAMPS)
        s._op("fsync")
        d.durable_files[name] = d.files[name]

    def reuse(self, name: str, entry: str, source: str) -> bool:
        s = self._storage
        s._op("link", f"{entry}/{source} -> {self._entry}/{name}")
        data = s.read(entry, source)
        d = s._live[self._entry]
        d.files[name] = d.durable_files[name] = data
        d.stamps[name] = next(_STAMPS)
        return True

    def commit(self) -> None:
        s = self._storage
        s._op("fsync_dir")
        d = s._live[self._entry]
        d.durable_names = set(d.files)
        if self._final in s._live and not self._replace:
            raise StorageError(f"could not commit {self._final}: it exists")
        s._op("rename", f"{self._entry} -> {self._final}")
        s._live[self._final] = s._live.pop(self._entry)
        s._op("fsync_root")
        s._durable_root = dict(s._live)
        self._done = True

    def abort(self) -> None:
        if not self._done:
            self._storage._live.pop(self._entry, None)
            self._done = True


class MemoryStorage:
    """See the module docstring; entries live in dictionaries.

    Args:
        fail_at: Make the ``fail_at``-th operation (0-based) raise :class:`InjectedFailure`
            (tests).
        name: The URL that messages name it by.
    """

    capabilities = Capabilities(local_reads=False, directories=False)  # no files, no mapping

    def __init__(self, *, fail_at: int | None = None, name: str = "memory://run") -> None:
        self.fail_at = fail_at
        self.operations = 0
        self.log: list[str] = []  # every operation, in order: "rename step_000000002.partial-..."
        self._name = name
        self._live: dict[str, _Dir] = {}
        self._durable_root: dict[str, _Dir] = {}
        self._locked = False
        self._mutex = threading.Lock()

    def _op(self, kind: str, where: str = "") -> None:
        index = self.operations
        self.operations += 1
        self.log.append(f"{kind} {where}".strip())
        if self.fail_at is not None and index == self.fail_at:
            raise InjectedFailure(f"injected failure at operation {index} ({kind})")

    def copy(self) -> MemoryStorage:
        """An independent copy of the contents (unlocked, no failure armed, same op count).

        Returns:
            A new ``MemoryStorage`` with the same name, entries (live and durable) and
            operation count; changing one never changes the other.
        """
        other = MemoryStorage(name=self._name)
        other.operations = self.operations
        dirs = {
            id(d): _Dir(dict(d.files), dict(d.durable_files), set(d.durable_names))
            for d in self._live.values()
        }
        dirs.update(
            {
                id(d): _Dir(dict(d.files), dict(d.durable_files), set(d.durable_names))
                for d in self._durable_root.values()
                if id(d) not in dirs
            }
        )
        other._live = {n: dirs[id(d)] for n, d in self._live.items()}
        other._durable_root = {n: dirs[id(d)] for n, d in self._durable_root.items()}
        return other

    def crash(self) -> None:
        """Lose everything that was not durable, as a power cut would; drop the lock."""
        self._live = {}
        for name, d in self._durable_root.items():
            kept = {n: d.durable_files.get(n, b"") for n in d.durable_names}
            self._live[name] = _Dir(dict(kept), dict(kept), set(kept))
        self._durable_root = dict(self._live)
        self._locked = False
        self.fail_at = None

    def describe(self, entry: str = "", name: str = "") -> str:
        return "/".join(p for p in (self._name, entry, name) if p)

    def exists(self) -> bool:
        return bool(self._live)

    def entries(self) -> list[str]:
        return sorted(self._live)

    def _dir(self, entry: str) -> _Dir:
        try:
            return self._live[entry]
        except KeyError:
            raise FileNotFoundError(self.describe(entry)) from None

    def files(self, entry: str) -> list[str]:
        return sorted(self._dir(entry).files)

    def read(self, entry: str, name: str) -> bytes:
        try:
            return self._dir(entry).files[name]
        except KeyError:
            raise FileNotFoundError(self.describe(entry, name)) from None

    def fingerprint(self, entry: str, name: str) -> object | None:
        """The file's write stamp (a new one for every write, process-wide).

        Args:
            entry: The entry that holds the file.
            name: The file's name.

        Returns:
            ``(entry, name, stamp)``, or None when the entry or file does not exist.
        """
        found = self._live.get(entry)
        stamp = None if found is None else found.stamps.get(name)
        return None if stamp is None else (entry, name, stamp)

    def size(self, entry: str, name: str) -> int:
        return len(self.read(entry, name))

    def begin(self, entry: str, *, replace: bool = False) -> _MemoryTransaction:
        return _MemoryTransaction(self, entry, replace)

    def remove(self, entry: str) -> None:
        if entry in self._live:
            self._op("remove")
            self._live.pop(entry)
            self._durable_root.pop(entry, None)

    def write_file(self, entry: str, name: str, data: bytes) -> None:
        """Replace a committed file's bytes durably (for corruption tests).

        Counted as no operation, and the file keeps its write stamp: :meth:`fingerprint`
        says the same as before, as for a file damaged in place.

        Args:
            entry: The entry that holds the file.
            name: The file's name (created when the entry has none of that name).
            data: The file's new bytes.

        Raises:
            FileNotFoundError: ``entry`` does not exist.
        """
        d = self._dir(entry)
        d.files[name] = d.durable_files[name] = bytes(data)
        d.durable_names.add(name)

    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        with self._mutex:
            if self._locked:
                raise WriterConflictError(f"{self._name} is being written by another writer")
            self._locked = True
        try:
            yield
        finally:
            self._locked = False
