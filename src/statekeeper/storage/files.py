"""Which files statekeeper opens, and how: plain names, regular files, sizes checked first.

Every file a checkpoint names (in a manifest, a safetensors index, a DCP ``.metadata``) is
untrusted input. The rules, applied by every reader:

- **names**: a file name from a checkpoint is one path component in the character set
  ``A-Z a-z 0-9 . _ -`` (at most 255 characters, not ``.`` or ``..``): no separators, no
  absolute paths, no ``..``; :func:`check_name` says why a name is refused;
- **regular files only**: :func:`open_regular` opens without blocking (a FIFO cannot hang
  the reader) and checks with ``fstat`` that it opened a regular file before one byte is
  read (a device such as ``/dev/zero`` cannot feed it without bound);
- **no symbolic links inside statekeeper steps**: statekeeper never writes one, so a link in
  a step is refused (``follow=False``, the last component is opened with ``O_NOFOLLOW``).
  Foreign folders (Hugging Face, DCP, Accelerate) may hold links: the Hugging Face hub cache
  links every file of a snapshot to a blob; there ``follow=True`` opens what a link points
  to, which must still be a regular file;
- **sizes before bytes**: callers compare the size ``fstat`` reports with the size the
  checkpoint records before reading, so no claim makes a reader allocate what is not there.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from statekeeper.errors import CorruptCheckpointError

__all__ = [
    "fsync_dir",
    "link_regular",
    "NAME_RULE",
    "check_name",
    "file_kind",
    "name_problem",
    "open_directory",
    "open_regular",
    "regular_size",
]

NAME_RULE = "one path component of the characters A-Z a-z 0-9 . _ - (at most 255)"
_NAME = re.compile(r"[A-Za-z0-9._-]{1,255}")


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a file name a checkpoint may use, or None when it is one."""
    if not isinstance(name, str):
        return f"file name {name!r} is not a string"
    if _NAME.fullmatch(name) is None or name in (".", ".."):
        return f"file name {name!r} is not {NAME_RULE}"
    return None


def check_name(path: str, name: object) -> str:
    """``name`` when it is a valid file name; ``CorruptCheckpointError`` naming ``path`` (the
    document that named it) otherwise."""
    problem = name_problem(name)
    if problem is not None:
        raise CorruptCheckpointError(path, problem)
    return name  # type: ignore[return-value]  # name_problem checked it is a str


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words."""
    for test, kind in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _refuse(path: str, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        path, f"is {what}, not a regular file; statekeeper opens only regular files"
    )


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of the directory ``path`` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_directory(path: str | os.PathLike[str]) -> int:
    """A descriptor of the directory ``path`` itself, never through a symbolic link (files
    are then opened relative to it: nothing outside can be swapped in by a link).
    ``CorruptCheckpointError`` when it is a link or not a directory; ``FileNotFoundError``
    when it is absent."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            what = file_kind(os.lstat(path).st_mode)
            raise CorruptCheckpointError(
                os.fspath(path),
                f"is {what}, not a directory; statekeeper reads a step only where it lies",
            ) from None
        raise


def open_regular(
    path: str | os.PathLike[str], *, follow: bool = False, dir_fd: int | None = None
) -> int:
    """A read-only descriptor of the regular file ``path`` (relative to ``dir_fd`` when
    given), opened without blocking.

    ``CorruptCheckpointError`` when it is a symbolic link (unless ``follow``), a FIFO, a
    device, a socket or a directory; ``FileNotFoundError`` when it is absent. Nothing is read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise _refuse(os.fspath(path), "a symbolic link") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a socket, a directory
            mode = os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode
            raise _refuse(os.fspath(path), file_kind(mode)) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refuse(os.fspath(path), file_kind(mode))
    os.set_blocking(fd, True)
    return fd


def regular_size(
    path: str | os.PathLike[str], *, follow: bool = False, dir_fd: int | None = None
) -> int:
    """The size of the regular file ``path`` (``lstat``, or ``stat`` with ``follow``); the
    same refusals as :func:`open_regular`, without opening anything."""
    info = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(os.fspath(path), file_kind(info.st_mode))
    return info.st_size


_CANNOT_LINK = frozenset(
    {errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}
)


def link_regular(source: Path, target: Path) -> bool:
    """Hard-link the regular file ``source`` as ``target``; False where the file system
    cannot (no hard links there, another device, too many links). ``source`` must be a
    regular file (a link or device is refused: ``CorruptCheckpointError``)."""
    mode = os.lstat(source).st_mode
    if not stat.S_ISREG(mode):
        raise _refuse(str(source), file_kind(mode))
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _CANNOT_LINK:
            return False
        raise
    return True
