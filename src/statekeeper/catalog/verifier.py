"""Checksums of a step's files: the one place where they are verified.

A file is verified against the manifest's size and checksum in one of three ways, all of
which read it through :func:`open_file` (size checked before a byte is read) and raise the
same errors:

- :func:`read_verified`: one file, on its own;
- :class:`Verifier`: computed in a worker thread while the caller parses and decodes the
  same bytes (``read_step``, ``statekeeper verify``), then confirmed all at once;
- :class:`VerifiedReads`: each file the first time a reader needs it (offline averaging
  streams a step's shards, a rank of a distributed load reads only its chunks).

Nothing read from a file reaches a live object before the file is verified.
"""

from __future__ import annotations

from concurrent.futures import Future, wait

from statekeeper.catalog.location import Location
from statekeeper.errors import CorruptCheckpointError, StatekeeperError
from statekeeper.format.checksum import Buffer, checksum, matches
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.lanes import Lane, lane
from statekeeper.progress import Progress
from statekeeper.storage.optional import capabilities_of

__all__ = [
    "THREAD_FROM",
    "Progress",
    "VerifiedReads",
    "Verifier",
    "missing",
    "open_file",
    "read_verified",
]


THREAD_FROM = 4 << 20  # smaller steps are hashed inline: a thread costs more than it saves


def _check_size(location: Location, manifest: Manifest, name: str, found: int) -> None:
    size = manifest.files[name].size
    if found != size:
        raise CorruptCheckpointError(
            location.path(name), f"size is {found} bytes, the manifest says {size}"
        )


def _sized(location: Location, manifest: Manifest, name: str, data: Buffer) -> Buffer:
    """``data``, if it is as long as the manifest records for file ``name``."""
    _check_size(location, manifest, name, len(data))
    return data


def _mismatch(location: Location, manifest: Manifest, name: str) -> CorruptCheckpointError:
    expected = manifest.files[name].checksum
    return CorruptCheckpointError(location.path(name), f"checksum mismatch (expected {expected})")


def missing(location: Location, name: str) -> StatekeeperError:
    """The error for a file of the step that is not there: the step was deleted while it was
    read (``StepNotFoundError``), or the step is damaged (``CorruptCheckpointError``)."""
    if location.gone():
        return location.gone_error()
    what = (
        "manifest.json is missing" if name == MANIFEST else "file listed in the manifest is missing"
    )
    return CorruptCheckpointError(location.path(name), what)


def open_file(location: Location, manifest: Manifest, name: str) -> Buffer:
    """The file's bytes, of the size the manifest records (not yet checksummed). The size is
    checked before anything is read: no claim makes a reader take more than is there."""
    for again in (False, True):  # once more where the step was renamed meanwhile
        storage, entry = location.storage, location.entry
        try:
            _check_size(location, manifest, name, storage.size(entry, name))
            data = storage.read(entry, name)
            break
        except FileNotFoundError as exc:
            if again or not location.relocate():
                raise missing(location, name) from exc
    return _sized(location, manifest, name, data)


def read_verified(location: Location, manifest: Manifest, name: str) -> Buffer:
    """The file's bytes, verified against the manifest's size and checksum."""
    data = open_file(location, manifest, name)
    if not matches(data, manifest.files[name].checksum):
        raise _mismatch(location, manifest, name)
    return data


class VerifiedReads:
    """The files of one step, read when needed: each verified (:func:`read_verified`) the
    first time it is read or :meth:`verify`-ed, afterwards only size-checked
    (:func:`open_file`). :meth:`trust_all` records that every file was verified elsewhere
    (by the other ranks of a distributed load, which agreed)."""

    def __init__(self, location: Location, manifest: Manifest) -> None:
        self._location = location
        self._manifest = manifest
        self._verified: set[str] = set()
        self._all = False

    def verify(self, name: str) -> Buffer:
        """File ``name``'s bytes, checksummed now (whether or not it was before)."""
        data = read_verified(self._location, self._manifest, name)
        self._verified.add(name)
        return data

    def read(self, name: str) -> Buffer:
        """File ``name``'s bytes, verified unless they were already."""
        if self._all or name in self._verified:
            return open_file(self._location, self._manifest, name)
        return self.verify(name)

    def trust_all(self) -> None:
        self._all = True


class Verifier:
    """Checksums computed in one worker thread while the caller decodes the same files.

    xxhash releases the GIL, so hashing (about 0.04 s per GiB from the page cache) overlaps
    the manifest parsing, the header parsing, the tensor checks and the state decoding on
    the caller's thread (about 0.04 s for 3,304 tensors). On local storage the step's
    safetensors files are opened and their hashing started before the manifest is even
    parsed (``start_early``); the manifest then says which results count. Results are checked
    in the order the files were opened, so the first bad file is reported, as when the files
    were checked one by one. ``bench/io.py``'s warm load: 0.39 s (hash, then decode) -> 0.27 s
    (this thread, the faster parse) -> 0.11-0.12 s (early start, direct copies).
    """

    def __init__(self, location: Location) -> None:
        self._location = location
        self._pool: Lane | None = None
        self._early: dict[str, Buffer] = {}
        self._results: dict[str, Future[str]] = {}
        self._opened: list[str] = []
        self._threaded: bool | None = None  # hash in the thread: decided by the step's size

    def start_early(self) -> None:
        storage, entry = self._location.storage, self._location.entry
        if not capabilities_of(storage).local_reads:  # elsewhere a read is a download: not blind
            return
        try:
            names = [n for n in storage.files(entry) if n.endswith(".safetensors")]
            if sum(storage.size(entry, n) for n in names) < THREAD_FROM:
                return
            for name in names:
                self._early[name] = storage.read(entry, name)
                self._submit(name, self._early[name], threaded=True)
        except (OSError, StatekeeperError):  # the manifest's own checks will name what is wrong
            return

    def _submit(self, name: str, data: Buffer, threaded: bool) -> None:
        if threaded and self._pool is None:
            self._pool = lane("verify")  # long-lived: see statekeeper/lanes.py
        if self._pool is None:
            result: Future[str] = Future()
            result.set_result(checksum(data))
        else:
            result = self._pool.submit(checksum, data)
        self._results[name] = result

    def open(self, manifest: Manifest, name: str) -> Buffer:
        """File ``name``'s bytes (opened early or now) of the recorded size, being hashed."""
        data = self._early.pop(name, None)
        if data is None:
            data = open_file(self._location, manifest, name)
            if self._threaded is None:
                self._threaded = sum(r.size for r in manifest.files.values()) >= THREAD_FROM
            self._submit(name, data, threaded=self._threaded)
        else:
            _sized(self._location, manifest, name, data)
        self._opened.append(name)
        return data

    def check(self, manifest: Manifest, progress: Progress | None = None) -> None:
        """Wait for every opened file; raise for the first whose checksum differs."""
        total = sum(r.size for r in manifest.files.values())
        done = 0
        for name in self._opened:
            record = manifest.files[name]
            if self._results[name].result() != record.checksum:
                raise _mismatch(self._location, manifest, name)
            done += record.size
            if progress is not None:
                progress(done, total)

    def close(self) -> None:
        self._early.clear()
        if self._pool is not None:  # none of its jobs reads the files after this returns
            for result in self._results.values():
                result.cancel()
            wait(list(self._results.values()))
