"""Pickle streams read as data: the globals they name, and an allowlist-only evaluator.

Neither function imports or calls anything a stream names unless it is in the caller's
explicit allowlist. :func:`scan_globals` only disassembles (``pickletools.genops``), so it
is safe on any input; it is how refused files are explained. :func:`restricted_load` runs the
stream with a small stack machine that resolves ``GLOBAL``/``STACK_GLOBAL`` only through the
allowlist, the way ``torch.load`` with ``weights_only=True`` does, but for every pickle protocol
(torch's weights-only unpickler stops at protocol 4's ``FRAME``, which DCP's ``.metadata``
uses).
"""

from __future__ import annotations

import _compat_pickle
import io
import pickletools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

__all__ = [
    "DisallowedAttribute", "DisallowedGlobal", "restricted_load", "scan_globals", "scan_stream",
]  # fmt: skip

_STRINGS = {
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
    "BINUNICODE8",
}  # fmt: skip


class DisallowedGlobal(ValueError):
    """The stream names a global that the allowlist does not hold."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"global {name} is not allowed")


class DisallowedAttribute(DisallowedGlobal):
    """A ``BUILD`` would set a dunder attribute (``__setstate__``, ``__class__``, ...) of an
    object: refused, since that would change which code the object runs or what it is."""

    def __init__(self, cls: type, attribute: str) -> None:
        name = f"{cls.__module__}.{cls.__qualname__}.{attribute}"
        ValueError.__init__(self, f"BUILD would set the attribute {name}, which is not allowed")
        self.name = name
        self.attribute = attribute


def _ops(stream: BinaryIO) -> Iterator[tuple[str, Any]]:
    for op, arg, _ in pickletools.genops(stream):
        yield op.name, arg


def _python3_name(module: str, name: str) -> str:
    """``__builtin__.print`` (how protocol 2 spells it) -> ``builtins.print``."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


def scan_stream(stream: BinaryIO) -> list[str]:
    """The ``module.name`` globals of one pickle in ``stream``, in order, without repeats.

    Reads up to and including the pickle's ``STOP``. ``STACK_GLOBAL`` operands are followed
    through the memo. Raises ``ValueError`` when the stream is not a complete pickle.
    """
    found: dict[str, None] = {}
    pushed: list[Any] = []  # what each op pushed, as far as strings matter
    memo: dict[int, Any] = {}
    try:
        for name, arg in _ops(stream):
            if name == "GLOBAL":
                found[_python3_name(*str(arg).split(" ", 1))] = None
                pushed.append(None)
            elif name == "STACK_GLOBAL":
                module, attr = (pushed[-2], pushed[-1]) if len(pushed) >= 2 else (None, None)
                found[f"{module}.{attr}" if isinstance(module, str) else "<unknown global>"] = None
                pushed.append(None)
            elif name in _STRINGS:
                pushed.append(arg if isinstance(arg, str) else None)
            elif name == "MEMOIZE":
                memo[len(memo)] = pushed[-1] if pushed else None
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg)] = pushed[-1] if pushed else None
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                pushed.append(memo.get(int(arg)))
            elif name not in ("FRAME", "PROTO"):
                pushed.append(None)
    except Exception as exc:  # pickletools raises ValueError, EOFError, struct.error...
        raise ValueError(f"not a complete pickle stream ({exc})") from None
    return list(found)


def scan_globals(data: bytes) -> list[str]:
    """:func:`scan_stream` over a pickle held in memory."""
    return scan_stream(io.BytesIO(data))


class _Mark:
    pass


def _pop_mark(stack: list[Any]) -> list[Any]:
    for i in range(len(stack) - 1, -1, -1):
        if isinstance(stack[i], _Mark):
            items = stack[i + 1 :]
            del stack[i:]
            return items
    raise ValueError("malformed pickle: MARK expected")


def _top(stack: list[Any]) -> Any:
    """The value on top of the stack; never a MARK (as pickle's own stack underflow check)."""
    if not stack or isinstance(stack[-1], _Mark):
        raise ValueError("malformed pickle: stack underflow")
    return stack[-1]


def _pop(stack: list[Any], n: int = 1) -> list[Any]:
    """The top ``n`` values, oldest first, popped; none of them may be a MARK."""
    if len(stack) < n or any(isinstance(v, _Mark) for v in stack[len(stack) - n :]):
        raise ValueError("malformed pickle: stack underflow")
    items = stack[len(stack) - n :]
    del stack[len(stack) - n :]
    return items


def _target(stack: list[Any], kind: type) -> Any:
    """The container on top of the stack, which must be a plain ``kind`` (list/dict/set)."""
    if not stack or type(stack[-1]) is not kind:
        raise ValueError(f"pickle adds items to something that is not a {kind.__name__}")
    return stack[-1]


def _build(obj: Any, state: Any, allowed_types: tuple[type, ...]) -> None:
    """``BUILD``: the class's own ``__setstate__`` (never one found on the instance), else
    the state's items set as attributes; dunder names are refused either way."""
    cls = type(obj)
    if not isinstance(obj, allowed_types):
        raise ValueError(f"BUILD on a {cls.__name__}, which the allowlist does not hold")
    slots = None
    whole = state
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    for source in (state, slots):
        if isinstance(source, dict):
            for key in source:
                if not isinstance(key, str):
                    raise ValueError(f"BUILD state has a key that is not a str: {key!r}")
                if key.startswith("__"):
                    raise DisallowedAttribute(cls, key)
    setstate: Callable[[Any, Any], None] | None = getattr(cls, "__setstate__", None)
    if setstate is not None:
        setstate(obj, whole)
        return
    for source in (state, slots):
        if source:
            if not isinstance(source, dict):
                raise ValueError("BUILD state is not a dict")
            for key, value in source.items():
                object.__setattr__(obj, key, value)


_SIMPLE: dict[str, Callable[[Any], Any]] = {
    **{n: lambda a: a for n in _STRINGS},
    **{n: lambda a: a for n in ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1")},
    **{n: lambda a: a for n in ("LONG4", "FLOAT", "BINFLOAT", "BINBYTES", "SHORT_BINBYTES")},
    "BINBYTES8": lambda a: a,
    "BYTEARRAY8": bytearray,
    "NONE": lambda a: None,
    "NEWTRUE": lambda a: True,
    "NEWFALSE": lambda a: False,
    "EMPTY_DICT": lambda a: {},
    "EMPTY_LIST": lambda a: [],
    "EMPTY_TUPLE": lambda a: (),
    "EMPTY_SET": lambda a: set(),
}


def restricted_load(data: bytes, allowed: Mapping[str, object]) -> Any:
    """Evaluate a pickle whose globals must all be keys of ``allowed`` (``"module.name"``).

    Only the allowed objects are ever called (``REDUCE``/``NEWOBJ``) and only instances of
    allowed classes receive ``BUILD``, which calls only a ``__setstate__`` their class defines.
    Raises :class:`DisallowedGlobal` for any other global, :class:`DisallowedAttribute` (a
    ``DisallowedGlobal``) for a ``BUILD`` state key starting with ``__``, and ``ValueError``
    for anything malformed (a stack underflow, a ``MARK`` left over) or unsupported. Errors
    raised by the allowed callables themselves propagate unchanged.
    """
    allowed_types = tuple(v for v in allowed.values() if isinstance(v, type))
    stack: list[Any] = []
    memo: dict[int, Any] = {}

    def resolve(name: str) -> object:
        if name not in allowed:
            raise DisallowedGlobal(name)
        return allowed[name]

    def call(func: Any, args: Any) -> Any:
        if not any(func is v for v in allowed.values()) or not isinstance(args, tuple):
            raise ValueError(f"call of {func!r} is not allowed")
        return func(*args)

    try:
        ops = list(_ops(io.BytesIO(data)))
    except Exception as exc:
        raise ValueError(f"not a complete pickle stream ({exc})") from None
    for name, arg in ops:
        if name in _SIMPLE:
            stack.append(_SIMPLE[name](arg))
        elif name in ("PROTO", "FRAME"):
            continue
        elif name == "STOP":
            if len(stack) != 1 or isinstance(stack[0], _Mark):
                raise ValueError("malformed pickle: STOP with a stack of the wrong size")
            return stack[0]
        elif name == "MARK":
            stack.append(_Mark())
        elif name == "TUPLE":
            stack.append(tuple(_pop_mark(stack)))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            stack.append(tuple(_pop(stack, int(name[-1]))))
        elif name == "LIST":
            stack.append(_pop_mark(stack))
        elif name == "DICT":
            items = _pop_mark(stack)
            stack.append(dict(zip(items[::2], items[1::2], strict=True)))
        elif name == "APPEND":
            (value,) = _pop(stack)
            _target(stack, list).append(value)
        elif name == "APPENDS":
            items = _pop_mark(stack)
            _target(stack, list).extend(items)
        elif name == "SETITEM":
            key, value = _pop(stack, 2)
            _target(stack, dict)[key] = value
        elif name == "SETITEMS":
            items = _pop_mark(stack)
            target = _target(stack, dict)
            for key, value in zip(items[::2], items[1::2], strict=True):
                target[key] = value
        elif name == "ADDITEMS":
            items = _pop_mark(stack)
            _target(stack, set).update(items)
        elif name == "FROZENSET":
            stack.append(frozenset(_pop_mark(stack)))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = _top(stack)
        elif name == "MEMOIZE":
            memo[len(memo)] = _top(stack)
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if int(arg) not in memo:
                raise ValueError(f"malformed pickle: memo entry {arg} was never stored")
            stack.append(memo[int(arg)])
        elif name == "POP":
            if stack and isinstance(stack[-1], _Mark):
                stack.pop()  # as pickle does: POP right after MARK drops the mark
            else:
                _pop(stack)
        elif name == "POP_MARK":
            _pop_mark(stack)
        elif name == "DUP":
            stack.append(_top(stack))
        elif name == "GLOBAL":
            stack.append(resolve(_python3_name(*str(arg).split(" ", 1))))
        elif name == "STACK_GLOBAL":
            module, attr = _pop(stack, 2)
            stack.append(resolve(f"{module}.{attr}"))
        elif name == "REDUCE":
            func, args = _pop(stack, 2)
            stack.append(call(func, args))
        elif name == "NEWOBJ":
            cls, args = _pop(stack, 2)
            if not any(cls is t for t in allowed_types) or not isinstance(args, tuple):
                raise ValueError(f"NEWOBJ of {cls!r} is not allowed")
            stack.append(cls.__new__(cls, *args))
        elif name == "BUILD":
            (state,) = _pop(stack)
            _build(_top(stack), state, allowed_types)
        else:
            raise ValueError(f"pickle opcode {name} is not supported")
    raise ValueError("pickle stream has no STOP")
