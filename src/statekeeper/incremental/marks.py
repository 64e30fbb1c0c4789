"""What an incremental save remembers of tensors between saves of one process.

- :class:`Mark`: a frozen parameter as a save found it: its storage (the live storage
  object itself, weakly held: a new storage at a freed one's address is another object),
  where in it, its dtype, shape and strides, its version counter (moved by every in-place
  write) and a hash of 16 spread-out 4 KiB samples of its bytes. With
  ``Incremental.TRUST_MARKS``, a frozen shard whose tensors keep their marks since the last
  save is taken to hold the bytes checksummed then (a sparse write that no counter sees
  and the samples miss is not seen: the default hashes the live bytes instead).
- :func:`steady_names`: the tensors whose storage, layout and version counter did not move
  since the last save, grouped into shards of their own.
- :class:`Memo`: a small, bounded, thread-safe map for what is remembered (upload threads
  and the saving thread use it at once). Memos belong to their owner
  (:class:`~statekeeper.incremental.reuse.IncrementalCache`); a memo used in a forked
  child starts empty, with a lock of its own (the parent's may have been held by one of its
  threads at the fork): no fork hook is needed.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
import xxhash

from statekeeper.storage.base import Storage

__all__ = ["Mark", "Memo", "Seen", "frozen_marks", "steady_names"]

_SAMPLES = 16
_SAMPLE_BYTES = 4096

K = TypeVar("K")
V = TypeVar("V")


class Memo(Generic[K, V]):
    """At most ``limit`` entries, the least recently set dropped first; safe across threads;
    empty again in a forked child (what the parent saw is not the child's to trust)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _locked(self) -> threading.Lock:
        """This memo's lock; in a forked child, a new one and no entries."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._data = OrderedDict()
            self._pid = os.getpid()
        return self._lock

    def get(self, key: K) -> V | None:
        with self._locked():
            return self._data.get(key)

    def set(self, key: K, value: V) -> None:
        with self._locked():
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._limit:
                self._data.popitem(last=False)

    def swap(self, key: K, make: Callable[[V | None], V]) -> V | None:
        """Set ``key`` to ``make(old)`` atomically; the old value."""
        with self._locked():
            old = self._data.get(key)
            self._data[key] = make(old)
            self._data.move_to_end(key)
            while len(self._data) > self._limit:
                self._data.popitem(last=False)
            return old

    def clear(self) -> None:
        with self._locked():
            self._data.clear()


@dataclass(frozen=True, eq=False)
class Mark:
    """A tensor's storage (weakly held), place, layout, version counter and sampled bytes."""

    storage: weakref.ref[torch.UntypedStorage]
    layout: tuple[object, ...]  # offset, dtype, shape, strides, bytes
    version: int
    sample: int

    @classmethod
    def of(cls, t: torch.Tensor) -> Mark | None:
        """The tensor's mark; None where it cannot have a sound one: a tensor off the CPU
        or not contiguous (its bytes cannot be sampled cheaply), or without a version
        counter (an inference tensor)."""
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or not t.is_cpu:
            return None
        if not t.is_contiguous() or t.numel() == 0 or t.is_conj() or t.is_neg():
            return None
        try:
            version = t._version
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        layout = (t.storage_offset(), t.dtype, tuple(t.shape), t.stride(), t.nbytes)
        return cls(weakref.ref(storage), layout, version, _sample(t))

    def same(self, other: Mark) -> bool:
        """Whether ``other`` marks the same live storage, place and layout, unwritten."""
        mine = self.storage()
        return (
            mine is not None
            and mine is other.storage()
            and (self.layout, self.version, self.sample)
            == (other.layout, other.version, other.sample)
        )


def frozen_marks(stored: Mapping[str, torch.Tensor], frozen: Collection[str]) -> dict[str, Mark]:
    """Marks of the frozen tensors about to be written (the tensors themselves, as the state
    dict gives them: a hook's new tensor gets a new storage and never keeps its mark). A
    tensor whose storage another tensor of the state shares (a view in another dtype, a
    slice) gets none: a write through the other moves no counter of its own."""

    def key(t: torch.Tensor) -> int | None:
        try:
            return int(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            return None

    users: dict[int | None, int] = {}
    for t in stored.values():
        users[key(t)] = users.get(key(t), 0) + 1
    marks: dict[str, Mark] = {}
    for name in frozen:
        found = stored.get(name)
        if found is None or key(found) is None or users[key(found)] != 1:
            continue
        mark = Mark.of(found)
        if mark is not None:
            marks[name] = mark
    return marks


def _sample(t: torch.Tensor) -> int:
    raw = t.detach().reshape(-1).view(torch.uint8).numpy()
    step = max(len(raw) // _SAMPLES, 1)
    state = xxhash.xxh3_64()
    for start in range(0, len(raw), step):
        state.update(raw[start : start + _SAMPLE_BYTES].tobytes())
    return state.intdigest()


_Place = tuple["weakref.ref[torch.UntypedStorage]", tuple[object, ...]]
Seen = Memo[str, dict[str, _Place]]
"""Per storage, the tensors of its owner's last save there (see :func:`steady_names`)."""


def _place(t: torch.Tensor) -> _Place | None:
    """A tensor's storage object (weakly held), and its place, layout and version counter."""
    try:
        storage = t.untyped_storage()
        version = t._version
    except (RuntimeError, NotImplementedError):
        return None
    return weakref.ref(storage), (t.storage_offset(), t.dtype, tuple(t.shape), t.stride(), version)


def steady_names(
    storage: Storage, stored: Mapping[str, torch.Tensor], seen: Seen
) -> frozenset[str]:
    """The tensors of ``stored`` (live ones, not staged copies) whose storage object, place,
    layout and version counter did not move since the previous save to ``storage`` that
    ``seen`` remembers. They go to shards of their own (after the frozen parameters), so that
    tensors that stay unchanged (buffers left alone, an EMA copy between its updates) share
    files that the next save reuses whole. Only a grouping: whether a file is reused is
    decided by its checksum, never by this."""
    now = {name: place for name, t in stored.items() if (place := _place(t)) is not None}
    before = seen.swap(storage.describe(), lambda _: now) or {}
    steady = set()
    for name, (ref, layout) in now.items():
        old = before.get(name)
        if old is not None and old[0]() is not None and old[0]() is ref() and old[1] == layout:
            steady.add(name)
    return frozenset(steady)
