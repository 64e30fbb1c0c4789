"""A safetensors file's header, parsed and checked strictly, without torch.

:func:`read_header` checks everything a reader must before it trusts one offset: the length
prefix against the file and :data:`~statekeeper.format.jsondoc.MAX_HEADER_BYTES`, the JSON
(bounded nesting), every entry's dtype code, shape (non-negative ints whose sizes can exist)
and data offsets (inside the data, exactly as long as shape and dtype say), and that the
tensors' data tile the data section (no overlap, no gap, nothing trailing).

It is the one safetensors reader: :func:`statekeeper.format.safetensors_io.parse` builds
tensors from what it returns (for statekeeper's own steps and, through
:mod:`statekeeper.interop.safetensors_files`, for foreign files, which add only their own
limits and the ``__metadata__`` they carry); ``statekeeper verify`` compares it with the
manifest without building any.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import NamedTuple

from statekeeper.format.dtypes import SIZE_OF_CODE
from statekeeper.format.jsondoc import MAX_HEADER_BYTES, parse_json
from statekeeper.format.malformed import FormatError

__all__ = ["Entry", "Header", "read_header"]

_MAX_ELEMENTS = 1 << 62  # torch sizes are int64; no real tensor comes near


class Entry(NamedTuple):
    """One tensor's record: dtype code, shape, element count and byte span in the data (a
    tuple: one is made per tensor on every load)."""

    code: str
    shape: list[int]
    numel: int
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """The tensors' records, where the data begins, and the ``__metadata__`` value as found
    (None when absent; statekeeper's own files have none, foreign readers check it)."""

    entries: dict[str, Entry]
    start: int  # where the data section begins in the file
    metadata: object = None


_INT = frozenset({int})
_make = tuple.__new__


def _entry(name: str, info: object, end_of_data: int) -> Entry:
    """One entry, checked with C-level operations (this runs once per tensor of every file
    read: 500,000 tensors, ``bench/average_empty.py``)."""
    if type(info) is not dict:
        raise FormatError(f"tensor {name!r} has a malformed header entry", key=name)
    code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    itemsize = SIZE_OF_CODE.get(code) if type(code) is str else None
    if (
        itemsize is None
        or type(shape) is not list
        or type(offsets) is not list
        or len(offsets) != 2
        or not set(map(type, offsets)) <= _INT
        or not set(map(type, shape)) <= _INT  # exact ints: a bool is not a size
    ):
        raise FormatError(f"tensor {name!r} has a malformed header entry", key=name)
    begin, end = offsets
    if shape and min(shape) < 0:
        raise FormatError(f"tensor {name!r} has a negative dimension", key=name)
    numel = math.prod(shape)
    span = numel or math.prod([d or 1 for d in shape])  # an empty tensor's other sizes too
    if span >= _MAX_ELEMENTS:
        raise FormatError(f"tensor {name!r} has a shape too large to exist: {shape}", key=name)
    if not 0 <= begin <= end <= end_of_data or end - begin != numel * itemsize:
        raise FormatError(f"tensor {name!r} has data offsets that do not fit its shape", key=name)
    return _make(Entry, (code, shape, numel, begin, end))  # tuple.__new__: no Python frame


def read_header(buf: memoryview) -> Header:
    """The checked header of the safetensors file in ``buf``; ``FormatError`` for anything
    that is not a well-formed file."""
    if len(buf) < 8:
        raise FormatError("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > len(buf) - 8:
        raise FormatError(f"header length {n} runs past the end of the file")
    if n > MAX_HEADER_BYTES:
        raise FormatError(f"header length {n} is larger than the {MAX_HEADER_BYTES} bytes allowed")
    try:
        header = parse_json(bytes(buf[8 : 8 + n]))
    except FormatError as exc:
        raise FormatError(f"header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise FormatError("header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    end_of_data = len(buf) - 8 - n
    entries = {name: _entry(name, info, end_of_data) for name, info in header.items()}
    position = 0
    for begin, end in sorted((e.begin, e.end) for e in entries.values()):
        if begin != position:
            raise FormatError("tensor data overlaps or leaves gaps")
        position = end
    if position != end_of_data:
        raise FormatError("trailing bytes after the tensor data")
    return Header(entries, 8 + n, metadata)
