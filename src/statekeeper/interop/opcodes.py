"""Pickle streams read as data: the globals they name, their shape, and an allowlist-only load.

:func:`scan_stream` and :func:`scan_globals` only disassemble (``pickletools.genops``), so they
are safe on any input; they are how refused files are explained. :func:`restricted_load` loads
a pickle whose globals must all be in the caller's explicit allowlist, the way ``torch.load``
with ``weights_only=True`` does, but for every pickle protocol (torch's weights-only unpickler
stops at protocol 4's ``FRAME``, which DCP's ``.metadata`` uses). It works in two steps:

1. **the survey** (:mod:`~statekeeper.interop.pickle_survey`), one pass over the opcodes
   (the pass the scan makes) that simulates the pickle's stack with what matters of each
   value (a string's text, which global made an object, how deeply tuples nest) and builds
   nothing. It lists the globals and refuses any opcode outside the plain data set (no
   ``INST``/``OBJ``/``NEWOBJ_EX``, persistent ids, extension codes or out-of-band buffers),
   a malformed stack (underflow, a ``MARK`` left over, a memo entry never stored, an opcode
   running past its ``FRAME``), a memo index beyond the values stored (which would size the
   unpickler's memo), tuples nested deeper than :data:`~statekeeper.format.jsondoc.MAX_DEPTH`
   (hashing them recurses in C), a call of anything but an allowlisted global with a tuple of
   arguments, items added to anything but a list, dict or set, a ``BUILD`` on anything but a
   new object of a plain allowlisted class, and a class that is both built and a value;
2. :class:`~statekeeper.interop.unpickler.AllowlistUnpickler`, a ``pickle.Unpickler`` whose
   ``find_class`` resolves names only through the allowlist and whose stand-in classes check
   each ``BUILD``'s state as it happens (no dunder keys), builds the object.

Globals outside the allowlist are refused first, wherever they are in the stream; then the
survey's first problem; then what unpickling finds.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, BinaryIO

from statekeeper.interop.pickle_stack import Survey
from statekeeper.interop.pickle_survey import survey_stream
from statekeeper.interop.unpickler import AllowlistUnpickler, DisallowedAttribute, DisallowedGlobal

__all__ = [
    "DisallowedAttribute", "DisallowedGlobal", "Survey", "restricted_load", "scan_globals",
    "scan_stream", "survey_stream",
]  # fmt: skip


def scan_stream(stream: BinaryIO) -> list[str]:
    """The ``module.name`` globals of one pickle in ``stream``, in order, without repeats.

    Reads up to and including the pickle's ``STOP``. ``STACK_GLOBAL`` operands are followed
    through the memo. Raises ``ValueError`` when the stream is not a complete pickle.
    """
    return list(survey_stream(stream).globals)


def scan_globals(data: bytes) -> list[str]:
    """:func:`scan_stream` over a pickle held in memory."""
    return scan_stream(io.BytesIO(data))


def restricted_load(data: bytes, allowed: Mapping[str, object]) -> Any:
    """Unpickle ``data``, whose globals must all be keys of ``allowed`` (``"module.name"``).

    Only the allowed objects are ever called (``REDUCE``/``NEWOBJ``) and only new instances of
    allowed classes receive ``BUILD``, which calls only a ``__setstate__`` their class defines.
    Raises :class:`DisallowedGlobal` for any other global (before anything is built, wherever
    it is in the stream), :class:`DisallowedAttribute` (a ``DisallowedGlobal``) for a
    ``BUILD`` state key starting with ``__``, and ``ValueError`` for anything malformed (a
    stack underflow, a ``MARK`` left over) or unsupported. Errors raised by the allowed
    callables themselves propagate unchanged.
    """
    found = survey_stream(io.BytesIO(data), allowed)
    for name in found.globals:
        if name not in allowed:
            raise DisallowedGlobal(name)
    if found.problem is not None:
        raise ValueError(found.problem)
    return AllowlistUnpickler(data, allowed, found.names, found.stand_ins).load_restored()
