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
from collections.abc import Callable, Iterator
from pathlib import Path

from statekeeper.errors import CorruptCheckpointError

__all__ = [
    "OpenedFile",
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
            ) from exc
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
            raise _refuse(os.fspath(path), "a symbolic link") from exc
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a socket, a directory
            mode = os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode
            raise _refuse(os.fspath(path), file_kind(mode)) from exc
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


class OpenedFile:
    """A regular file opened once (read-only, never through a link): what a check before a
    link may look at. Both views go through the one descriptor, so the bytes checked are
    those of the inode that is then linked, whatever happens to its name meanwhile."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fingerprint(self) -> tuple[int, int, int, int]:
        """(device, inode, size, modification time), as ``LocalStorage.fingerprint`` gives."""
        st = os.fstat(self._fd)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def chunks(self, size: int = 16 << 20) -> Iterator[memoryview]:
        """The file's bytes, front to back, in pieces read into one reused buffer (each
        piece valid until the next is asked for). Read, not mapped: an unreadable sector is
        an ``OSError`` here, not a ``SIGBUS``."""
        buffer = bytearray(size)
        view = memoryview(buffer)
        offset = 0
        while n := os.preadv(self._fd, [view], offset):
            offset += n
            yield view[:n]


_PROC_FD = "/proc/self/fd"


def link_regular(
    source: Path, target: Path, check: Callable[[OpenedFile], bool] | None = None
) -> bool:
    """Hard-link the regular file ``source`` as ``target``, by its descriptor: ``source`` is
    opened once (``O_NOFOLLOW``, in its own directory opened without following links),
    ``check`` (when given) looks at it through that descriptor, and that very inode is
    linked: ``linkat`` of ``/proc/self/fd/N`` with ``AT_SYMLINK_FOLLOW`` (no privilege
    needed). Without ``/proc`` (macOS, a container without it) the name is linked and the
    link kept only when it is the inode that was checked. A file put at ``source``'s name
    after it was opened is never linked.

    False, and nothing at ``target``, whenever the link is not made for any reason: the
    source is gone (deleted before or after it was opened), is not a regular file, fails
    ``check``, or the file system cannot link it (another device, too many links, no hard
    links). The caller then writes the file itself."""
    try:
        dfd = open_directory(source.parent)
    except (OSError, CorruptCheckpointError):
        return False
    try:
        fd = open_regular(source.name, dir_fd=dfd)
    except (OSError, CorruptCheckpointError):
        os.close(dfd)
        return False
    try:
        if check is not None and not check(OpenedFile(fd)):
            return False
        tfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return _link_open(fd, dfd, source.name, tfd, target.name)
        finally:
            os.close(tfd)
    except OSError:
        return False
    finally:
        os.close(fd)
        os.close(dfd)


def _link_open(fd: int, dfd: int, name: str, tfd: int, target: str) -> bool:
    """Link the open file ``fd`` (named ``name`` in the directory ``dfd``) as ``target`` in
    the directory ``tfd``; True when the new name is that very file."""
    if os.path.isdir(_PROC_FD):
        # a directory descriptor makes CPython call linkat(..., AT_SYMLINK_FOLLOW); with
        # none it calls link(), which does not follow /proc's link (EXDEV)
        os.link(f"{_PROC_FD}/{fd}", target, dst_dir_fd=tfd, follow_symlinks=True)
        return True
    os.link(name, target, src_dir_fd=dfd, dst_dir_fd=tfd, follow_symlinks=False)
    mine, linked = os.fstat(fd), os.stat(target, dir_fd=tfd, follow_symlinks=False)
    if (linked.st_dev, linked.st_ino) == (mine.st_dev, mine.st_ino):
        return True
    os.unlink(target, dir_fd=tfd)  # another file was put at the name meanwhile
    return False
