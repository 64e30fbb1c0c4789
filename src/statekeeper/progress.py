"""The one progress callback type of every long operation (save, load, read, convert, ...)."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Progress"]

Progress = Callable[[int, int], None]
"""Called as ``progress(done, total)`` while work advances: bytes for reads and writes,
items (tensors, inputs) where the caller's documentation says so. ``total`` does not change
during one operation."""
