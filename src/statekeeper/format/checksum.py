"""File checksums: ``"xxh3_128:<32 hex digits>"`` over the file's bytes."""

from __future__ import annotations

import xxhash

__all__ = ["ALGORITHM", "checksum", "matches"]

ALGORITHM = "xxh3_128"


def checksum(data: bytes | memoryview) -> str:
    """The checksum string stored in the manifest for ``data``."""
    return f"{ALGORITHM}:{xxhash.xxh3_128_hexdigest(data)}"


def matches(data: bytes | memoryview, expected: str) -> bool:
    """Whether ``data`` has checksum ``expected`` (an unknown algorithm never matches)."""
    return expected.startswith(f"{ALGORITHM}:") and checksum(data) == expected
