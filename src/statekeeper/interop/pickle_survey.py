"""One pass over a pickle's opcodes (``pickletools.genops``) that builds nothing: the
globals it names and, against an allowlist, the first reason to refuse unpickling it.

Each opcode acts on the survey's stack (:mod:`statekeeper.interop.pickle_stack`) as it acts
on the C unpickler's, with what matters of each value: a string's text (``STACK_GLOBAL``
names), which global made an object (``BUILD`` targets), how deeply tuples nest. Opcodes
outside the plain data set :func:`~statekeeper.interop.opcodes.restricted_load` accepts are
refused but still followed by their documented stack effect, so the scan of any pickle
lists its globals. An opcode that runs past the end of its ``FRAME`` is refused: the C
unpickler would read it from other bytes than ``pickletools`` does.
"""

from __future__ import annotations

import functools
import pickletools
import sys
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

from statekeeper.interop.pickle_stack import OTHER, Global, Stack, Survey, Value
from statekeeper.interop.unpickler import can_stand_in, python3_name

__all__ = ["survey_stream"]

_STRINGS = {
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
    "BINUNICODE8",
}  # fmt: skip
_SCALARS = {
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "NONE", "NEWTRUE", "NEWFALSE",
}  # fmt: skip
_SUPPORTED = _STRINGS | _SCALARS | {
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP", "PUT", "BINPUT", "LONG_BINPUT",
    "MEMOIZE", "GET", "BINGET", "LONG_BINGET", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2",
    "TUPLE3", "EMPTY_LIST", "LIST", "APPEND", "APPENDS", "EMPTY_DICT", "DICT", "SETITEM",
    "SETITEMS", "EMPTY_SET", "ADDITEMS", "FROZENSET", "GLOBAL", "STACK_GLOBAL", "REDUCE",
    "NEWOBJ", "BUILD",
}  # fmt: skip
"""What :func:`restricted_load` accepts: plain data, allowlisted globals, calls and BUILD."""


def _stack_effects() -> dict[str, tuple[bool, int, int]]:
    """Opcode -> (pops to a MARK, values popped besides, values pushed), from pickletools."""
    effects = {}
    for op in pickletools.opcodes:
        to_mark = pickletools.markobject in op.stack_before
        count = op.stack_before.index(pickletools.markobject) if to_mark else len(op.stack_before)
        effects[op.name] = (to_mark, count, len(op.stack_after))
    return effects


_EFFECTS = _stack_effects()
_CONTAINERS = {"list": Value("list"), "dict": Value("dict"), "set": Value("set")}
_MADE_CONTAINERS = ((dict, "dict"), (list, "list"), (set, "set"))


class _Walk(Stack):
    """The survey: one method per kind of opcode."""

    def handlers(self) -> dict[str, Callable[[Any], None]]:
        """Opcode name -> what reads it on this walk."""
        bound = {}
        for name, (method, first) in _HANDLERS.items():
            read = getattr(self, method)
            bound[name] = functools.partial(read, *first) if first else read
        return bound

    # -- opcodes, by what they do

    def string(self, arg: Any) -> None:
        self.stack.append(Value("str", arg if isinstance(arg, str) else None))

    def scalar(self, arg: Any) -> None:
        self.stack.append(OTHER)

    def nothing(self, arg: Any) -> None:
        pass

    def frame(self, arg: Any) -> None:
        if int(arg) > sys.maxsize:
            self.fail(f"malformed pickle: a FRAME of {arg} bytes")

    def mark(self, arg: Any) -> None:
        self.marks.append(len(self.stack))

    def pop(self, arg: Any) -> None:
        if self.marks and self.marks[-1] == len(self.stack):
            self.marks.pop()  # as pickle does: POP right after MARK drops the MARK
        else:
            self.spend(self.take(1))

    def pop_mark(self, arg: Any) -> None:
        self.spend(self.take_to_mark())

    def dup(self, arg: Any) -> None:
        self.push_again(self.top())

    def put(self, arg: Any) -> None:
        if int(arg) > self.stored:
            self.fail(f"malformed pickle: memo index {arg} skips past the {self.stored} stored")
        self.memo[int(arg)] = self.top()
        self.stored += 1

    def memoize(self, arg: Any) -> None:
        self.memo[len(self.memo)] = self.top()
        self.stored += 1

    def get(self, arg: Any) -> None:
        value = self.memo.get(int(arg))
        if value is None:
            self.fail(f"malformed pickle: memo entry {arg} was never stored")
        self.push_again(value or OTHER)

    def empty(self, kind: str, arg: Any) -> None:
        self.stack.append(self.nested([]) if kind == "tuple" else _CONTAINERS[kind])

    def tuple_(self, size: int, arg: Any) -> None:
        items = self.take(size) if size >= 0 else self.take_to_mark()
        self.stack.append(self.nested(items))

    def frozenset_(self, arg: Any) -> None:
        self.stack.append(self.nested(self.take_to_mark(), "frozenset"))

    def collection(self, kind: str, arg: Any) -> None:
        items = self.take_to_mark()
        if kind == "dict" and len(items) % 2:
            self.fail("malformed pickle: DICT with an odd number of items")
        self.stack.append(_CONTAINERS[kind])

    def add(self, kind: str, size: int, arg: Any) -> None:
        items = self.take(size) if size >= 0 else self.take_to_mark()
        if kind == "dict" and len(items) % 2:
            self.fail("malformed pickle: SETITEMS with an odd number of items")
        self.target(kind)

    def global_(self, arg: Any) -> None:
        module, name = str(arg).split(" ", 1)
        self.stack.append(self.add_global(python3_name(module, name)))

    def stack_global(self, arg: Any) -> None:
        module, name = self.take(2)
        known = module.kind == name.kind == "str" and module.text is not None
        full = python3_name(module.text or "", name.text or "") if known else "<unknown global>"
        self.stack.append(self.add_global(full))

    def unsupported(self, name: str, arg: Any) -> None:
        """An opcode :func:`restricted_load` refuses (an ``INST`` still names its global)."""
        self.fail(f"pickle opcode {name} is not supported")
        if name == "INST":
            module, attr = str(arg).split(" ", 1)
            self.found[python3_name(module, attr)] = None
        self.other(name)

    def call(self, op: str, arg: Any) -> None:
        func, args = self.take(2)
        self.spend([func])
        what = func.text if isinstance(func, Global) else "a value that is not a global"
        if not isinstance(func, Global):
            self.fail(f"call of {what} is not allowed")
        elif args.kind != "tuple":
            self.fail(f"call of {what} with arguments that are not a tuple is not allowed")
        elif op == "NEWOBJ" and not isinstance(self.allowed.get(func.text or ""), type):
            self.fail(f"NEWOBJ of {what} is not allowed")
        self.stack.append(self.made(func))

    def made(self, func: Value) -> Value:
        """What calling ``func`` makes, as far as the survey cares (the same for every call
        of one global: what matters of an object is which global made it)."""
        if not isinstance(func, Global):
            return OTHER
        if func.product is None:
            value = self.allowed.get(func.text or "")
            kind = next((k for c, k in _MADE_CONTAINERS if value is c), None)
            func.product = _CONTAINERS[kind] if kind else Value("object", func.text, maker=func)
        return func.product

    def build(self, arg: Any) -> None:
        self.take(1)  # the state: checked key by key while unpickling
        target = self.top()
        maker = target.maker
        if maker is None:
            what = f"the global {target.text}" if target.kind == "global" else f"a {target.kind}"
            self.fail(f"BUILD on {what}, which the allowlist does not hold")
        elif not can_stand_in(self.allowed.get(maker.text or "")):
            self.fail(f"BUILD on a {maker.text} is not allowed: only plain classes are built")
        else:
            maker.rebuilt = True

    def stop(self, arg: Any) -> None:
        if len(self.stack) != 1 or self.marks:
            self.fail("malformed pickle: STOP with a stack of the wrong size")

    def other(self, name: str) -> None:
        """Any other opcode, by the stack effect pickletools documents for it."""
        to_mark, count, pushed = _EFFECTS[name]
        if to_mark:
            self.take_to_mark()
        self.take(count)
        self.stack.extend([OTHER] * pushed)


def _handlers() -> dict[str, tuple[str, tuple[Any, ...]]]:
    """Opcode -> the :class:`_Walk` method that reads it and the arguments it takes first."""
    table: dict[str, tuple[str, tuple[Any, ...]]] = {
        **dict.fromkeys(_STRINGS, ("string", ())), **dict.fromkeys(_SCALARS, ("scalar", ())),
        "PROTO": ("nothing", ()), "FRAME": ("frame", ()), "STOP": ("stop", ()),
        "MARK": ("mark", ()), "POP": ("pop", ()), "POP_MARK": ("pop_mark", ()),
        "DUP": ("dup", ()), **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), ("put", ())),
        "MEMOIZE": ("memoize", ()), **dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), ("get", ())),
        "EMPTY_TUPLE": ("empty", ("tuple",)), "EMPTY_LIST": ("empty", ("list",)),
        "EMPTY_DICT": ("empty", ("dict",)), "EMPTY_SET": ("empty", ("set",)),
        "TUPLE": ("tuple_", (-1,)), "TUPLE1": ("tuple_", (1,)), "TUPLE2": ("tuple_", (2,)),
        "TUPLE3": ("tuple_", (3,)), "FROZENSET": ("frozenset_", ()),
        "LIST": ("collection", ("list",)), "DICT": ("collection", ("dict",)),
        "APPEND": ("add", ("list", 1)), "APPENDS": ("add", ("list", -1)),
        "SETITEM": ("add", ("dict", 2)), "SETITEMS": ("add", ("dict", -1)),
        "ADDITEMS": ("add", ("set", -1)), "GLOBAL": ("global_", ()),
        "STACK_GLOBAL": ("stack_global", ()), "REDUCE": ("call", ("REDUCE",)),
        "NEWOBJ": ("call", ("NEWOBJ",)), "BUILD": ("build", ()),
    }  # fmt: skip
    for op in pickletools.opcodes:
        if op.name not in _SUPPORTED:
            table[op.name] = ("unsupported", (op.name,))
    return table


_HANDLERS = _handlers()


def survey_stream(stream: BinaryIO, allowed: Mapping[str, object] | None = None) -> Survey:
    """The :class:`Survey` of one pickle in ``stream`` (read up to and including its
    ``STOP``), judged against ``allowed`` (``"module.name"`` -> object). Raises ``ValueError``
    when the stream is not a complete pickle."""
    walk = _Walk(allowed or {})
    handlers = walk.handlers()
    frame_end = start = -1  # where the last FRAME ends; where the last opcode began
    try:
        for op, arg, at in pickletools.genops(stream):
            at = -1 if at is None else at  # a stream without tell(): no frames to check
            if start < frame_end < at:
                # the C unpickler would read the last opcode from other bytes than genops did
                walk.fail("malformed pickle: an opcode runs past the end of its FRAME")
            if op.name == "FRAME" and at >= 0:
                if at < frame_end:
                    walk.fail("malformed pickle: a FRAME starts inside another")
                frame_end = at + 9 + int(arg or 0)
            start = at
            handlers[op.name](arg)
    except Exception as exc:  # pickletools raises ValueError, EOFError, struct.error...
        raise ValueError(f"not a complete pickle stream ({exc})") from exc
    return walk.survey()
