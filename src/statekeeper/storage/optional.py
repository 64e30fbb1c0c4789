"""What a storage backend may do beyond the :mod:`statekeeper.storage.base` protocol, each
asked for by a function that answers None (or nothing special) for a backend without it.

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

A storage may also have ``exclusive_writer_lock()`` (optional: :func:`exclusive_lock_of`):
the writer lock for one save alone, refused while the same object holds the lock already
and not re-entered while held. ``statekeeper.save`` takes it; a backend whose
``writer_lock`` is re-entrant for its object (local directories) needs it, so that one
object cannot run two saves, or a clean-up beside a save, at once.

Backends differ in what a read costs and in whether a run directory exists apart from its
entries; each says so in its :class:`Capabilities` (:func:`capabilities_of`), and callers
ask it, never the backend's class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "Capabilities", "CheckedReuse", "Opened", "Reuse", "capabilities_of", "checked_reuser_of",
    "exclusive_lock_of", "fingerprint_of", "identity_of", "reuser_of",
]  # fmt: skip


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


def exclusive_lock_of(storage: object) -> Callable[[], AbstractContextManager[None]] | None:
    """``storage.exclusive_writer_lock`` where the backend has one: the writer lock taken for
    one save alone, which even the object that holds the lock already cannot re-enter (a
    local directory's lock is re-entrant for its object, so that a Checkpointer's clean-up
    runs under the lock it holds); None for a backend without one, whose ``writer_lock``
    :func:`statekeeper.catalog.paths.writer_lock` then takes (a wrapper that forwards
    ``writer_lock`` alone loses the exclusivity)."""
    return _optional(storage, "exclusive_writer_lock")
