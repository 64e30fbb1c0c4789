"""The survey's model of a pickle's stack: what it knows of each value, the stack with its
MARKs and memo checked as the C unpickler checks them, and what it found (:class:`Survey`).

Nothing here builds or imports anything a pickle names; :mod:`statekeeper.interop.pickle_survey`
reads the opcodes into it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from statekeeper.format.jsondoc import MAX_DEPTH

__all__ = ["OTHER", "Global", "Stack", "Survey", "Value"]


class Value:
    """What the survey knows of one value on the stack: its ``kind`` (``str``, ``global``,
    ``object``, ``tuple``, ``frozenset``, ``list``, ``dict``, ``set`` or ``other``), a str's
    ``text`` or an object's class name, how deeply tuples nest in it (``depth``), and for an
    object, the global that made it (``maker``)."""

    __slots__ = ("depth", "kind", "maker", "text")

    def __init__(
        self, kind: str, text: str | None = None, depth: int = 0, maker: Global | None = None
    ) -> None:
        self.kind = kind
        self.text = text
        self.depth = depth
        self.maker = maker


class Global(Value):
    """The value of one ``GLOBAL``/``STACK_GLOBAL`` opcode (the ``index``-th): whether it
    made objects that receive ``BUILD`` (``rebuilt``), how many times it was put on the stack
    (``pushed``: by its opcode, ``GET`` and ``DUP``) and taken off it to be called or dropped
    (``spent``). Each other time it was stored, passed or returned: used as a value."""

    __slots__ = ("index", "product", "pushed", "rebuilt", "spent")

    def __init__(self, name: str, index: int) -> None:
        super().__init__("global", name)
        self.index = index
        self.rebuilt = False
        self.pushed = 1
        self.spent = 0
        self.product: Value | None = None  # what calling it makes


OTHER = Value("other")
"""Any value whose kind does not matter."""
_TUPLES = [Value("tuple", depth=d) for d in range(8)]  # shared: only the depth matters


@dataclass(frozen=True)
class Survey:
    """What one pass over a pickle's opcodes found, nothing built.

    ``globals``: the ``module.name`` globals it names, in order, without repeats;
    ``names``: the name each ``GLOBAL``/``STACK_GLOBAL`` opcode resolves, in stream order;
    ``stand_ins``: the positions in ``names`` whose objects receive ``BUILD``;
    ``problem``: the first reason :func:`restricted_load` refuses it, or None.
    """

    globals: tuple[str, ...]
    names: tuple[str, ...]
    stand_ins: frozenset[int]
    problem: str | None


class Stack:
    """The stack, MARKs and memo of one pickle as the survey simulates them; ``allowed``
    (``"module.name"`` -> object) decides which calls and BUILDs are fine. Each problem is
    recorded (the first one is kept) and the walk goes on, so that every global is listed."""

    def __init__(self, allowed: Mapping[str, object]) -> None:
        self.allowed = allowed
        self.stack: list[Value] = []
        self.marks: list[int] = []  # the stack's length at each open MARK, as pickle keeps them
        self.memo: dict[int, Value] = {}
        self.stored = 0  # PUT and MEMOIZE opcodes so far
        self.found: dict[str, None] = {}
        self.globals: list[Global] = []
        self.problem: str | None = None

    def fail(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem

    def survey(self) -> Survey:
        for g in self.globals:
            if g.rebuilt and g.pushed > g.spent:
                self.fail(f"the class {g.text} both makes objects that BUILD sets and is a value")
        return Survey(
            globals=tuple(self.found),
            names=tuple(g.text or "" for g in self.globals),
            stand_ins=frozenset(g.index for g in self.globals if g.rebuilt),
            problem=self.problem,
        )

    # -- the stack, checked as the unpickler checks it

    def take(self, n: int) -> list[Value]:
        """The top ``n`` values above the last MARK, popped, oldest first."""
        stack = self.stack
        fence = self.marks[-1] if self.marks else 0
        start = len(stack) - n
        items = stack[start:]
        if start < fence:
            self.fail("malformed pickle: stack underflow")
            items = [OTHER] * (fence - start) + stack[fence:]
            start = fence
        del stack[start:]
        return items

    def take_to_mark(self) -> list[Value]:
        if not self.marks:
            self.fail("malformed pickle: MARK expected")
        at = self.marks.pop() if self.marks else 0
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def top(self) -> Value:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            self.fail("malformed pickle: stack underflow")
            return OTHER
        return self.stack[-1]

    @staticmethod
    def spend(items: list[Value]) -> None:
        """``items`` were called or dropped (not used as values)."""
        for v in items:
            if isinstance(v, Global):
                v.spent += 1

    def push_again(self, value: Value) -> None:
        if isinstance(value, Global):
            value.pushed += 1
        self.stack.append(value)

    def target(self, kind: str) -> None:
        """The container an APPEND, SETITEM or ADDITEMS adds to."""
        if self.top().kind != kind:
            self.fail(f"pickle adds items to something that is not a {kind}")

    def nested(self, items: list[Value], kind: str = "tuple") -> Value:
        depth = 1
        for v in items:
            if v.depth >= depth:
                depth = v.depth + 1
        if depth > MAX_DEPTH:
            self.fail(f"tuples nest {depth} levels deep, more than the {MAX_DEPTH} allowed")
        if kind == "tuple" and depth < len(_TUPLES):
            return _TUPLES[depth]
        return Value(kind, depth=depth)

    def add_global(self, name: str) -> Global:
        self.found[name] = None
        g = Global(name, len(self.globals))
        self.globals.append(g)
        return g
