"""Parsing a manifest's JSON with its ``tensors`` member read entry by entry.

A manifest holds one ``tensors`` entry per stored tensor. ``json.loads`` builds every entry
as a dict of three fresh values before any is turned into a record: for 500,000 tensors that
transient tree is about 700 MB, more than the records, the state and the rest of an average
together (``bench/average_empty.py``). Here the document is walked member by member with the
standard library's own scanner (``JSONDecoder.raw_decode``, the C parser ``json.loads``
uses), and each ``tensors`` entry becomes a shared-field :class:`TensorRecords` record as
soon as it is read, so the transient is one entry.

The result equals ``json.loads(text)`` for every document (same values, same errors for
malformed ones, as :class:`~statekeeper.format.malformed.FormatError`), except that an
object-valued ``tensors`` member comes back as :class:`TensorRecords`. An entry that is
not a well-formed record is kept as parsed and flagged, so the
caller checks the manifest's checksum before it reports the entry.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, NamedTuple

from statekeeper.format.jsondoc import LongInteger, decimal_int, json_loads

__all__ = ["TensorRecord", "TensorRecords", "parse_manifest_json", "record_problem"]


class TensorRecord(NamedTuple):
    """Where one stored tensor lies, its dtype and shape. A named tuple, not a dataclass: a
    manifest holds one per tensor, and reading 500,000 of them is half a manifest's parse
    (``bench/average_empty.py``)."""

    file: str
    dtype: str
    shape: tuple[int, ...]


class TensorRecords(dict[str, Any]):
    """The ``tensors`` member as read: records, and the raw value of each entry that is not
    one (``malformed`` lists their names)."""

    malformed: list[str]


_WS = re.compile(r"[ \t\n\r]*")
_FAST = json.JSONDecoder()
_SLOW = json.JSONDecoder(parse_int=decimal_int)  # a document holding a long integer
_INT = frozenset({int})
_make = tuple.__new__


def record_problem(name: str, r: object) -> str | None:
    """Why the entry ``r`` of ``name`` is not a record, or None."""
    if not isinstance(r, dict) or not {"file", "dtype", "shape"} <= r.keys():
        return f"tensor {name!r}: malformed record {r!r}"
    if type(r["file"]) is not str or type(r["dtype"]) is not str:
        return f"tensor {name!r}: malformed record {r!r}"
    dims = r["shape"]
    if type(dims) is not list or not set(map(type, dims)) <= _INT:
        return f"tensor {name!r}: expected a list of integers, found {dims!r}"
    return None


class _Shared:
    """Equal file names, dtypes and shapes as one object each (not one per tensor)."""

    def __init__(self) -> None:
        self.strings: dict[str, str] = {}
        self.shapes: dict[tuple[int, ...], tuple[int, ...]] = {}

    def record(self, r: dict[str, Any]) -> TensorRecord:
        file, dtype, shape = r["file"], r["dtype"], tuple(r["shape"])
        strings = self.strings
        return _make(
            TensorRecord,
            (strings.setdefault(file, file), strings.setdefault(dtype, dtype),
             self.shapes.setdefault(shape, shape)),
        )  # fmt: skip


def _skip(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]  # matches the empty string


def _expect(text: str, pos: int, char: str) -> int:
    if text[pos : pos + 1] != char:
        raise json.JSONDecodeError(f"Expecting {char!r}", text, pos)
    return _skip(text, pos + 1)


def _key(decoder: json.JSONDecoder, text: str, pos: int) -> tuple[str, int]:
    if text[pos : pos + 1] != '"':
        raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, pos)
    key, end = decoder.raw_decode(text, pos)
    return key, _expect(text, _skip(text, end), ":")


def _members(decoder: json.JSONDecoder, text: str, pos: int, on_value: Any) -> int:
    """Walk the object at ``pos`` (after ``{`` and blanks): ``on_value(key, pos)`` reads each
    value and returns the position after it. Returns the position after the ``}``."""
    if text[pos : pos + 1] == "}":
        return pos + 1
    while True:
        key, pos = _key(decoder, text, pos)
        pos = _skip(text, on_value(key, pos))
        if text[pos : pos + 1] == "}":
            return pos + 1
        pos = _skip(text, _expect(text, pos, ","))


def _records(decoder: json.JSONDecoder, text: str, pos: int) -> tuple[TensorRecords, int]:
    out = TensorRecords()
    out.malformed = []
    shared = _Shared()
    scan = decoder.raw_decode

    def entry(name: str, at: int) -> int:
        value, end = scan(text, at)
        if record_problem(name, value) is None:
            out[name] = shared.record(value)
        else:
            out[name] = value
            out.malformed.append(name)
        return end

    return out, _members(decoder, text, _skip(text, pos + 1), entry)


def _parse(decoder: json.JSONDecoder, text: str) -> Any:
    pos = _skip(text, 0)
    if text[pos : pos + 1] != "{":  # not an object: the manifest's caller refuses it
        return decoder.decode(text)
    body: dict[str, Any] = {}

    def member(key: str, at: int) -> int:
        if key == "tensors" and text[at : at + 1] == "{":
            body[key], end = _records(decoder, text, at)
        else:
            body[key], end = decoder.raw_decode(text, at)
        return end

    end = _skip(text, _members(decoder, text, _skip(text, pos + 1), member))
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return body


def parse_manifest_json(text: str) -> Any:
    """``json.loads(text)`` with the ``tensors`` member read as :class:`TensorRecords`;
    ``FormatError`` for any malformed document, nesting too deep included. Long integers
    are read as :func:`~statekeeper.format.jsondoc.parse_json` reads them."""
    try:
        return json_loads(functools.partial(_parse, _FAST), text)
    except LongInteger:
        pass
    return json_loads(functools.partial(_parse, _SLOW), text)
