"""Parsing JSON documents from checkpoints in bounded time, memory and stack.

Every JSON document statekeeper reads (manifests, safetensors headers, index files) comes
through :func:`parse_json`:

- a size cap, checked by the caller before the bytes are read (``MAX_*`` below);
- nesting: the C parser stops with ``RecursionError`` where Python's recursion limit would
  be crossed; that becomes a ``FormatError`` like any other malformed document. Values that
  statekeeper walks recursively afterwards (the state tree, metrics) carry an explicit depth
  limit, :data:`MAX_DEPTH`, enforced on save as on load, so a document that parsed can never
  exhaust the stack later either.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from statekeeper.format.malformed import FormatError

__all__ = [
    "MAX_DEPTH",
    "MAX_HEADER_BYTES",
    "MAX_INDEX_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_DECIMAL_DIGITS",
    "LongInteger",
    "decimal_int",
    "depth_problem",
    "json_loads",
    "parse_json",
]

_Doc = Any  # what a parser takes: bytes or str

MAX_DEPTH = 100
"""Deepest nesting of a state tree or of metrics (containers within containers)."""
MAX_MANIFEST_BYTES = 256 << 20
"""About 2.5 million tensors (a manifest line is about 100 bytes); a larger one is refused
unread. Parsing holds several times the document in memory, so the cap bounds that too."""
MAX_HEADER_BYTES = 100_000_000
"""The safetensors reference implementation's own cap on a header."""
MAX_INDEX_BYTES = 256 << 20
"""A Hugging Face ``*.index.json``: a few MiB for the largest public models."""


MAX_DECIMAL_DIGITS = 1_000_000
"""Longest decimal integer read (older writers stored any int in decimal); converting one
takes time that grows faster than its length, so a longer one is refused as malformed."""
_DIRECT_DIGITS = 640  # the lowest limit sys.set_int_max_str_digits accepts (0 aside)


def decimal_int(text: str) -> int:
    """The int that the decimal ``text`` (an optional ``-``, then digits) spells, whatever
    ``sys.get_int_max_str_digits()`` allows: long ones are split and joined arithmetically
    (no conversion longer than 640 digits runs)."""
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text)
    if len(digits) > MAX_DECIMAL_DIGITS:
        raise FormatError(
            f"an integer of {len(digits)} decimal digits, more than the {MAX_DECIMAL_DIGITS} "
            "statekeeper reads"
        )
    return sign * _joined(digits)


def _joined(digits: str) -> int:
    if len(digits) <= _DIRECT_DIGITS:
        return int(digits)
    low = len(digits) // 2
    scale: int = 10**low
    return _joined(digits[:-low]) * scale + _joined(digits[-low:])


def parse_json(data: bytes | bytearray | str) -> Any:
    """``json.loads``; :class:`FormatError` for any malformed document (undecodable bytes
    and nesting too deep included)

    Integers longer than ``sys.get_int_max_str_digits()`` allows are read all the same
    (:func:`decimal_int`): what one process wrote reads back in every process."""
    try:
        return json_loads(json.loads, data)
    except LongInteger:
        pass
    return json_loads(functools.partial(json.loads, parse_int=decimal_int), data)


class LongInteger(Exception):
    """The document holds an integer longer than ``sys.get_int_max_str_digits()`` allows:
    parse it again with :func:`decimal_int`."""


def json_loads(loads: Callable[[_Doc], Any], data: _Doc) -> Any:
    """``loads(data)`` (a parser of the standard library's ``json``) with every error that
    malformed input makes it raise turned into :class:`FormatError` (``LongInteger`` for an
    integer over the digits limit). Only a parser's data errors: it runs no code of ours
    but :func:`decimal_int`, which raises ``FormatError`` itself."""
    try:
        return loads(data)
    except RecursionError:  # its thousand-frame traceback says nothing the message does not
        raise FormatError("nested too deeply to parse") from None
    except FormatError:
        raise
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError of bytes, digits limit
        if "integer string conversion" in str(exc):
            raise LongInteger(str(exc)) from exc
        raise FormatError(str(exc)) from exc


def depth_problem(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """Why ``value`` nests deeper than ``limit`` containers, or None (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return f"nested deeper than {limit} levels"
        stack.extend((child, depth + 1) for child in children)
    return None
