"""Durable file writes on a local (POSIX) file system: fsynced, with an early write-back.

:func:`write_file` replaces one file atomically (the safetensors files ``convert`` and
``export`` write, the upload journal): a temporary file beside it, fsynced, renamed over it,
the directory fsynced. :func:`write_durably` is the fsynced write that run directories'
files use (:mod:`statekeeper.storage.local`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from statekeeper.errors import StorageError
from statekeeper.storage.files import fsync_dir

__all__ = ["WRITEBACK_EVERY", "write_durably", "write_failure", "write_file"]


WRITEBACK_EVERY = 32 << 20
"""Bytes after which the disk is asked to start writing what was written so far (0: never).

Without it the kernel holds a whole shard dirty in memory (far below its dirty limits) and
the disk starts only at the ``fsync``; with it, the disk works while the rest is written.
``bench/io.py``'s durable-save row, 1 GiB, 5 interleaved rounds with this set to 0 in the
same run: 2.02 s median with it, 2.16 s without (the raw write bound: 1.83 s)."""


def _sync_file_range() -> Callable[[int, int, int], None] | None:
    """``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)`` where libc has it (Linux):
    start the write-out of a range without waiting for it. Durability still comes from fsync."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int

    def start(fd: int, offset: int, n: int) -> None:
        call(fd, offset, n, 2)  # SYNC_FILE_RANGE_WRITE; a failure only loses the head start

    return start


_START = _sync_file_range()


def _start_writeback(fd: int, offset: int, n: int) -> None:
    if _START is not None:
        _START(fd, offset, n)


def write_failure(exc: OSError, doing: str) -> StorageError:
    """A ``StorageError`` that keeps ``exc``'s errno and says what was being done."""
    reason = exc.strerror or str(exc)
    hint = ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "; free space on that file system (or save elsewhere)"
    return StorageError(exc.errno, f"{doing} failed: {reason}{hint}")


def write_durably(
    path: Path, chunks: Iterable[bytes | memoryview], shown: Path | None = None
) -> int:
    """Write ``chunks`` in order into the new or truncated file ``path``, then fsync it; the
    number of bytes written. A failure is a ``StorageError`` naming the file (``shown`` when
    ``path`` is a temporary file that stands for it)."""
    written = 0
    try:
        with open(path, "wb", buffering=0) as f:  # large writes: no extra copy
            fd = f.fileno()
            started = 0
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while view:
                    n = f.write(view)
                    view = view[n:]
                    written += n
                if WRITEBACK_EVERY and written - started >= WRITEBACK_EVERY:
                    _start_writeback(fd, started, written - started)
                    started = written
            os.fsync(fd)
    except StorageError:
        raise
    except OSError as exc:
        where = shown or path
        raise write_failure(exc, f"writing {where} ({written} bytes of it written)") from exc
    return written


def write_file(path: str | os.PathLike[str], chunks: Iterable[bytes | memoryview]) -> int:
    """Replace the file ``path`` (creating its folder) atomically and durably: ``chunks`` go
    into a temporary file beside it, which is fsynced and renamed over ``path``, then the
    folder is fsynced. A failure (``StorageError``) leaves ``path`` as it was and no
    temporary file behind. Returns the number of bytes written."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise write_failure(exc, f"creating a temporary file for {target}") from exc
    try:
        size = write_durably(Path(tmp), chunks, shown=target)
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, StorageError):
            raise write_failure(exc, f"replacing {target}") from exc
        raise
    try:
        fsync_dir(target.parent)
    except OSError as exc:
        raise write_failure(exc, f"making {target} durable") from exc
    return size
