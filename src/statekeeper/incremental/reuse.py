"""Incremental saves: a shard that is byte for byte a file of an earlier step is reused.

Before a shard is written, its checksum is computed from the live tensors (the same xxh3-128
over the same bytes the file would hold: header and tensor data, about 0.09 s per GiB, no
write) if the step it may reuse from (:mod:`statekeeper.checkpoint.independence` chooses it)
has a file of exactly its size. When a file of that step has that checksum, the new step
gets the file through the storage's ``reuse`` (a hard link, a server-side copy) instead of a
write, but only once the file's own bytes were checked against that checksum: locally, read
through the very descriptor that is then linked (:class:`Reuser`), so a damaged file or one
swapped in at the name is never linked. The new step's manifest records the file as usual
(same size, same checksum) and, in ``reused``, where it came from; readers see an ordinary
file and need nothing new.

Every step stays complete: a hard link is a second name of the same data, so deleting any
step (retention) never removes a file another step names. A storage without ``reuse``, a
file system without hard links, a link that fails for any reason, or a step whose manifest
cannot be read only means the shard is written.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial

import torch

from statekeeper.catalog.location import Location, committed
from statekeeper.catalog.manifests import read_manifest
from statekeeper.catalog.naming import ParsedEntry
from statekeeper.errors import StatekeeperError
from statekeeper.format.checksum import Hasher, matches
from statekeeper.format.manifest import FileRecord
from statekeeper.format.safetensors_io import ShardLayout, stream
from statekeeper.incremental.marks import Mark, Memo, Seen
from statekeeper.storage.base import FileWriter, Storage
from statekeeper.storage.optional import Opened, checked_reuser_of, fingerprint_of, reuser_of

__all__ = [
    "Incremental",
    "IncrementalCache",
    "Previous",
    "Reuser",
    "previous_step",
    "shard_checksum",
    "step_files",
]


class Incremental(StrEnum):
    """Whether a save reuses the files of an earlier step that it would write again.

    - ``REUSE``: a shard identical to a file of an earlier committed step is linked (or
      copied by the store) instead of written. Identity is proved at every save: the
      shard's checksum is computed from the live tensors, and the file's own bytes are read
      through the descriptor that is then linked and checked against that checksum;
    - ``TRUST_MARKS``: ``REUSE`` that skips both proofs where this process saw nothing
      change: a frozen shard whose parameters kept their marks is not hashed (a write that
      no version counter sees and the sampled bytes miss is then saved stale, for up to
      ``RECHECK_EVERY - 1`` saves), and a file this process wrote or checked is not read
      again while its fingerprint (device, inode, size, modification time) holds (a bad
      sector, or an edit that puts the modification time back, is then linked unseen);
    - ``WRITE_ALL``: every shard is written (a save that must not share data with another
      step, or a storage whose hard links are unwelcome).
    """

    REUSE = "reuse"
    TRUST_MARKS = "trust_marks"
    WRITE_ALL = "write_all"


@dataclass(frozen=True)
class Previous:
    """The files of the newest committed step before the one being written."""

    entry: str
    files: dict[str, FileRecord]
    by_size: dict[int, list[str]] = field(default_factory=dict)


def previous_step(storage: Storage, step: int) -> Previous | None:
    """The newest committed step other than ``step``, with its files; None when there is
    none or its manifest cannot be read (nothing is reused then)."""
    others = [p for p in committed(storage) if p.step != step]
    return step_files(storage, others[-1]) if others else None


def step_files(storage: Storage, parsed: ParsedEntry) -> Previous | None:
    """The files of the committed step ``parsed``; None when its manifest cannot be read."""
    entry = parsed.name
    try:
        manifest = read_manifest(Location(storage, entry, parsed.step))
    except (OSError, StatekeeperError):
        return None
    by_size: dict[int, list[str]] = {}
    for name, record in manifest.files.items():
        by_size.setdefault(record.size, []).append(name)
    return Previous(entry, dict(manifest.files), by_size)


def shard_checksum(tensors: dict[str, torch.Tensor], shard: ShardLayout) -> str:
    """The checksum the file of ``tensors`` laid out as ``shard`` would have (no write)."""
    hasher = Hasher()
    for chunk in stream(tensors, shard):
        hasher.update(chunk)
    return hasher.hexdigest()


RECHECK_EVERY = 8
"""With ``TRUST_MARKS``: a frozen shard whose checksum its marks gave this many saves in a
row is checksummed from its bytes again (a safety net for writes that no mark sees)."""


@dataclass(frozen=True)
class _Steady:
    """A frozen shard as this process last saved it: its tensors' names and marks, the
    file's checksum and size, and how many saves in a row took the checksum from marks."""

    names: tuple[str, ...]
    marks: tuple[Mark, ...]
    checksum: str
    size: int
    skips: int = 0


class IncrementalCache:
    """What incremental saves remember between saves, owned by whoever makes them: a
    ``Checkpointer`` (one for its life, its background saves included), a ``Mirror``'s
    uploader (for its uploads), and, for ``statekeeper.save``, which keeps nothing of its
    own, one cache of the process shared by every one-off save (per run directory, as
    before). A forked child finds each of them empty (:class:`~.marks.Memo`).

    - ``seen``: per storage, the tensors of the last save there (:func:`~.marks.steady_names`);
    - ``checked``: files found (or written) with their recorded checksum, by (storage,
      file): the storage's fingerprint of the file then, and the checksum. While the
      fingerprint stays the same the file is not read again, where that is trusted: always
      for a storage that copies by name (an object store's ETag), only with
      ``TRUST_MARKS`` for one that links what it checked (a local file's fingerprint
      cannot show a bad sector);
    - ``steady``: per (storage, shard file), the frozen shard as last saved.
    """

    def __init__(self) -> None:
        self.seen: Seen = Memo(64)
        self.checked: Memo[tuple[str, str], tuple[object, str]] = Memo(4096)
        self.steady: Memo[tuple[str, str], _Steady] = Memo(4096)


class Reuser:
    """Reuses the files of ``previous`` (the step to link from) for the shards of one save;
    ``marks`` are the frozen parameters' :class:`Mark` taken when the save began (used only
    with ``trust``: ``Incremental.TRUST_MARKS``); ``cache`` is its owner's memory of earlier
    saves."""

    def __init__(
        self,
        storage: Storage,
        files: FileWriter,
        previous: Previous | None,
        marks: Mapping[str, Mark | None],
        cache: IncrementalCache,
        shared: Collection[str] = (),
        trust: bool = False,
    ) -> None:
        self._storage = storage
        self._cache = cache
        self._previous = previous
        self._reuse = reuser_of(files)
        self._checked_reuse = checked_reuser_of(files)
        self._trust = trust  # Incremental.TRUST_MARKS
        # a tensor whose storage other tensors of the state view (an alias base) has no
        # sound mark: a write through one of those views moves no counter of its own
        self._marks = {n: m for n, m in marks.items() if n not in shared}
        self.reused: dict[str, str] = {}
        self.skipped = 0  # shards whose checksum came from their marks, not their bytes
        self._skips: dict[str, int] = {}

    def _marked(self, names: Sequence[str]) -> tuple[Mark, ...] | None:
        found = tuple(self._marks.get(n) for n in names)
        return None if any(m is None for m in found) else found  # type: ignore[return-value]

    def _known_checksum(self, name: str, names: tuple[str, ...], size: int) -> str | None:
        """The checksum of the shard ``name`` when its frozen tensors kept their marks since
        this process saved it last (same names, same size)."""
        marks = self._marked(names) if self._trust else None
        known = self._cache.steady.get((self._storage.describe(), name))
        if marks is None or known is None or (known.names, known.size) != (names, size):
            return None
        if known.skips + 1 >= RECHECK_EVERY:
            return None  # checksummed from its bytes this time
        if not all(a.same(b) for a, b in zip(known.marks, marks, strict=True)):
            return None
        self._skips[name] = known.skips + 1
        return known.checksum

    def _candidates(self, name: str, size: int) -> Iterator[str]:
        if self._previous is None or self._reuse is None:
            return
        same = self._previous.by_size.get(size, [])
        yield from sorted(same, key=lambda n: n != name)  # the same name first

    def _key(self, entry: str, name: str) -> tuple[str, str]:
        return (self._storage.describe(), f"{entry}/{name}")

    def _verified(self, entry: str, name: str, record: FileRecord, opened: Opened) -> bool:
        """Whether the opened file (the one about to be linked) has ``record``'s size and
        checksum: its bytes are read, unless ``trust`` and this process wrote or checked it
        with the same fingerprint. An unreadable file raises ``OSError`` (not linked)."""
        key = self._key(entry, name)
        if self._trust and self._cache.checked.get(key) == (opened.fingerprint(), record.checksum):
            return True
        hasher = Hasher()
        for chunk in opened.chunks():
            hasher.update(chunk)
        ok = (hasher.size, hasher.hexdigest()) == (record.size, record.checksum)
        if ok:
            self._cache.checked.set(key, (opened.fingerprint(), record.checksum))
        return ok

    def _intact(self, entry: str, name: str, record: FileRecord) -> bool:
        """For a storage that cannot link what it checked (an object store's copy by name):
        whether the stored file still has its recorded checksum. Its bytes are read unless
        this process wrote or checked the file before and the storage's fingerprint of it
        (an ETag: new with every write) has not changed since."""
        mark = fingerprint_of(self._storage, entry, name)
        if mark is not None and self._cache.checked.get(self._key(entry, name)) == (
            mark,
            record.checksum,
        ):
            return True
        try:
            ok = matches(self._storage.read(entry, name), record.checksum)
        except OSError:
            return False
        if ok and mark is not None:
            self._cache.checked.set(self._key(entry, name), (mark, record.checksum))
        return ok

    def committed(
        self, entry: str, records: dict[str, FileRecord], shards: Mapping[str, Sequence[str]]
    ) -> None:
        """Note the files of the step just committed as ``entry`` (their bytes are those
        this process checksummed or checked) and the marks of the frozen shards' tensors;
        ``shards``: file -> the names of its tensors. Only memory for the next saves: the
        step is committed whatever happens here, so nothing here may fail the save."""
        where = self._storage.describe()
        for name, record in records.items():
            try:
                mark = fingerprint_of(self._storage, entry, name)
            except (OSError, StatekeeperError):
                mark = None
            if mark is not None:
                self._cache.checked.set(self._key(entry, name), (mark, record.checksum))
            names = tuple(shards.get(name, ()))
            marks = self._marked(names) if names else None
            if marks is not None:
                skips = self._skips.get(name, 0)
                self._cache.steady.set(
                    (where, name), _Steady(names, marks, record.checksum, record.size, skips)
                )

    def try_reuse(
        self, name: str, tensors: dict[str, torch.Tensor], shard: ShardLayout
    ) -> FileRecord | None:
        """Reuse a file of the previous step as the shard ``name``; its record, or None
        when the shard must be written."""
        if not any(self._candidates(name, shard.size)):
            return None
        digest = self._known_checksum(name, tuple(tensors), shard.size)
        if digest is None:
            digest = shard_checksum(tensors, shard)
        else:
            self.skipped += 1
        return self.reuse_known(name, FileRecord(shard.size, digest))

    def reuse_known(self, name: str, record: FileRecord) -> FileRecord | None:
        """Reuse a file of the previous step whose size and checksum are ``record``'s as
        the file ``name``; ``record``, or None when it must be written."""
        if self._previous is None or self._reuse is None:
            return None
        entry = self._previous.entry
        for source in self._candidates(name, record.size):
            found = self._previous.files[source]
            if found.checksum != record.checksum:
                continue
            if self._checked_reuse is not None:
                # checked through the descriptor that is linked: never a file swapped in at
                # the name; any failure (gone, damaged, another device) means: write it
                check = partial(self._verified, entry, source, found)
                if not self._checked_reuse(name, entry, source, check):
                    continue
            elif not self._intact(entry, source, found):
                continue
            elif not self._reuse(name, entry, source):
                return None  # the storage cannot here: write it
            self.reused[name] = f"{entry}/{source}"
            return record
        return None
