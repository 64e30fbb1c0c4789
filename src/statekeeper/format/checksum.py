"""File checksums: ``"xxh3_128:<32 hex digits>"`` over the file's bytes."""

from __future__ import annotations

import mmap

import xxhash

__all__ = ["ALGORITHM", "Buffer", "Hasher", "checksum", "matches"]

Buffer = bytes | bytearray | memoryview | mmap.mmap

ALGORITHM = "xxh3_128"


def checksum(data: Buffer) -> str:
    """The checksum string stored in the manifest for ``data``."""
    return f"{ALGORITHM}:{xxhash.xxh3_128_hexdigest(data)}"


def matches(data: Buffer, expected: str) -> bool:
    """Whether ``data`` has checksum ``expected`` (an unknown algorithm never matches)."""
    return expected.startswith(f"{ALGORITHM}:") and checksum(data) == expected


class Hasher:
    """Checksum and size of bytes seen piece by piece (as they are written or read)."""

    def __init__(self) -> None:
        self._state = xxhash.xxh3_128()
        self.size = 0

    def update(self, data: Buffer) -> None:
        self._state.update(data)
        self.size += memoryview(data).nbytes

    def hexdigest(self) -> str:
        return f"{ALGORITHM}:{self._state.hexdigest()}"
