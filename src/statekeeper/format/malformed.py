"""The format layer's own exception, and the one place it becomes a statekeeper error.

The parsers of :mod:`statekeeper.format` (manifest, safetensors header, tagged JSON values,
aliases, sharding) raise :class:`FormatError` for bytes or a document that do not follow the
format, and nothing else: a ``TypeError`` or ``RuntimeError`` out of them is a bug and stays
one. The layers above catch exactly ``FormatError`` (and, for files written by other
libraries, exactly what those libraries raise for malformed bytes) and turn it into a
:class:`~statekeeper.errors.CorruptCheckpointError` naming the file with :func:`corrupt`,
raising it ``from`` the cause so that its message and traceback survive::

    try:
        header = read_header(data)
    except FormatError as exc:
        raise corrupt(path, exc, "not a valid safetensors file: {}") from exc
"""

from __future__ import annotations

from typing import Any

from statekeeper.errors import CorruptCheckpointError

__all__ = ["FormatError", "as_list", "as_object", "corrupt", "member"]


class FormatError(ValueError):
    """Bytes or a document that do not follow the format: ``str()`` says what is malformed
    (naming the tensor or the key path inside the document where known, also kept as
    ``key``). A ``ValueError``: code that caught those before still does.

    Internal to statekeeper: :func:`corrupt` turns it into the public error, naming the file.
    """

    def __init__(self, problem: str, *, key: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.key = key


def corrupt(path: str, exc: BaseException, template: str = "{}") -> CorruptCheckpointError:
    """The ``CorruptCheckpointError`` for the file at ``path`` (its step directory is part of
    it) that ``exc`` found malformed: ``template`` with its last ``{}`` replaced by ``exc``'s
    message (names put before it may hold braces); a ``template`` without one replaces it.

    Raise it ``from exc``: the cause, its traceback and (for a :class:`FormatError`) its
    ``key`` stay reachable as ``__cause__``.
    """
    before, mark, after = template.rpartition("{}")
    return CorruptCheckpointError(path, f"{before}{exc}{after}" if mark else template)


def as_object(value: object, what: str) -> dict[str, Any]:
    """``value`` when it is a JSON object, else a ``FormatError`` saying ``what`` it is."""
    if not isinstance(value, dict):
        raise FormatError(f"{what} is a {type(value).__name__}, not an object")
    return value


def as_list(value: object, what: str) -> list[Any]:
    """``value`` when it is a JSON array, else a ``FormatError`` saying ``what`` it is."""
    if not isinstance(value, list):
        raise FormatError(f"{what} is a {type(value).__name__}, not a list")
    return value


def member(obj: dict[str, Any], key: str, what: str) -> Any:
    """The member ``key`` of the JSON object ``what``, else a ``FormatError`` naming both."""
    try:
        return obj[key]
    except KeyError:  # the message names the member and its object: the KeyError adds nothing
        raise FormatError(f"{what} has no {key!r}", key=key) from None
