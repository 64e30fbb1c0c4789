"""The files of foreign checkpoints, opened the way :mod:`statekeeper.storage.files` says.

Foreign folders (Hugging Face, DCP, Accelerate) may hold symbolic links: the Hugging Face
hub cache links every file of a snapshot to a blob of its repository. So links are followed
here (``follow=True``), but a file that a document lists may only be a link that stays
inside its folder (or, in a hub cache snapshot, reaches the repository's ``blobs``), and
what a link reaches must be a regular file: a FIFO never blocks the reader and a device
(``/dev/zero``) is never read. Statekeeper's own steps are stricter (no links at all); that
is :mod:`statekeeper.checkpoint`'s business.

A file name that a document lists (a ``weight_map`` value, a DCP ``relative_path``) must be
one plain path component (:func:`~statekeeper.storage.files.check_name`), so that it can
only name a file of the folder that holds the document.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.jsondoc import parse_json
from statekeeper.format.malformed import FormatError, corrupt
from statekeeper.storage.files import check_name, open_regular, regular_size

__all__ = [
    "MAX_DIMS",
    "ZIP_MAGIC",
    "confined",
    "is_torch_file",
    "member",
    "open_file",
    "read_capped",
    "read_json",
    "size_of",
]

MAX_DIMS = 64
"""Most dimensions a tensor of a foreign checkpoint (safetensors, DCP) may claim."""
ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_MAGIC = b"\x80"  # PROTO: the legacy torch.save format starts with a pickle


def _regular(call: Callable[..., int], path: Path, listed_in: str | None) -> int:
    """``call(path, follow=True)`` (open or size a regular file), with a link loop, and a
    missing file that ``listed_in`` names, turned into ``CorruptCheckpointError``."""
    try:
        return call(path, follow=True)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptCheckpointError(str(path), "is a loop of symbolic links") from exc
        if listed_in is not None and exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise CorruptCheckpointError(str(path), f"listed in {listed_in} but missing") from exc
        raise


def open_file(path: Path, listed_in: str | None = None) -> int:
    """A descriptor of the regular file ``path`` (links followed); ``CorruptCheckpointError``
    when it is anything else, or when it is missing although ``listed_in`` names it."""
    return _regular(open_regular, path, listed_in)


def size_of(path: Path, listed_in: str | None = None) -> int:
    """The size of the regular file ``path``, with the refusals of :func:`open_file`."""
    return _regular(regular_size, path, listed_in)


def _hub_blobs(folder: Path) -> Path | None:
    """``<repo>/blobs`` when ``folder`` is a Hugging Face hub cache snapshot
    (``<repo>/snapshots/<revision>``), whose files are links to those blobs."""
    return folder.parent.parent / "blobs" if folder.parent.name == "snapshots" else None


def confined(folder: Path, path: Path, document: Path) -> Path:
    """``path`` (a file of ``folder``), refused when it is a link that leads outside the
    folder: data is never read from elsewhere on the strength of a link. The one exception
    is the Hugging Face hub cache, where a snapshot's files link to the repository's blobs."""
    if not path.is_symlink():
        return path
    size_of(path, str(document))  # what it reaches must be a regular file: say so first
    target = path.resolve()
    home = folder.resolve()
    blobs = _hub_blobs(home)
    if target.is_relative_to(home) or (blobs is not None and target.is_relative_to(blobs)):
        return path
    raise CorruptCheckpointError(
        str(document),
        f"{path.name} is a symbolic link that leads outside the checkpoint folder {str(folder)!r}",
    )


def member(folder: Path, document: Path, name: object) -> Path:
    """``folder / name`` for a ``name`` that ``document`` lists; ``CorruptCheckpointError``
    naming ``document`` unless ``name`` is one plain path component, and a link only when it
    stays inside the folder (:func:`confined`)."""
    return confined(folder, folder / check_name(str(document), name), document)


def read_capped(path: Path, cap: int, what: str, listed_in: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, refused unread when larger than ``cap``."""
    fd = open_file(path, listed_in)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise CorruptCheckpointError(
                str(path), f"{what} of {size} bytes is larger than the {cap} bytes allowed"
            )
        data = f.read(size + 1)
    if len(data) != size:
        raise CorruptCheckpointError(str(path), f"{what} changed size while it was read")
    return data


def read_json(path: Path, cap: int, what: str, listed_in: str | None = None) -> Any:
    """The JSON document in ``path`` (at most ``cap`` bytes, nesting bounded)."""
    data = read_capped(path, cap, what, listed_in)
    try:
        return parse_json(data)
    except FormatError as exc:  # undecodable bytes included
        raise corrupt(str(path), exc, f"{what} is not valid JSON ({{}})") from exc


def is_torch_file(path: Path) -> bool:
    """Whether ``path`` starts like a ``torch.save`` file (a zip, or a legacy pickle); read
    from its first bytes, without torch."""
    with os.fdopen(open_file(path), "rb") as f:
        head = f.read(4)
    return head == ZIP_MAGIC or head[:1] == _PICKLE_MAGIC
