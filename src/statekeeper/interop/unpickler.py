"""The runtime half of allowlist-only unpickling: a ``pickle.Unpickler`` whose ``find_class``
resolves globals only through an explicit allowlist, and stand-in classes that check every
``BUILD`` before it touches an object.

This module only builds what :func:`statekeeper.interop.opcodes.restricted_load` has already
surveyed: the survey (one pass over the opcodes, nothing run) refuses every opcode, shape and
use of a value that this unpickler is not meant to see, and says which globals must resolve to
a stand-in. What it cannot decide from the opcodes alone is decided here, while unpickling:

- **which global** each ``GLOBAL``/``STACK_GLOBAL`` names: anything outside the allowlist is a
  :class:`DisallowedGlobal`, and a name that differs from the survey's stops the load;
- **what a ``BUILD`` sets**: the C unpickler would call a ``__setstate__`` it finds on the
  instance (one planted by an earlier ``BUILD``) or write the state straight into the
  instance's ``__dict__`` (``__class__``, ``__dict__``, ...). So the classes whose instances
  receive a ``BUILD`` resolve to a stand-in: a subclass that adds no storage and whose
  ``__setstate__`` is a data descriptor (instance attributes cannot shadow it). It refuses
  state keys that are not ``str`` or that start with ``__`` (:class:`DisallowedAttribute`),
  then calls the ``__setstate__`` the real class defines, or sets the state's items as
  attributes. Once the stream is read, every object a stand-in made becomes an instance of the
  real class again (``__class__`` assignment: same layout), so no stand-in is left in the
  result. Classes that cannot have such a stand-in (enums, builtin and C types) are never
  ``BUILD`` targets: the survey refuses that.
"""

from __future__ import annotations

import _compat_pickle
import functools
import io
import pickle
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

__all__ = ["AllowlistUnpickler", "DisallowedAttribute", "DisallowedGlobal", "python3_name"]

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement or type()
_BASETYPE = 1 << 10  # Py_TPFLAGS_BASETYPE: may be subclassed
_IMMUTABLETYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: refuses __class__ assignment


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


def python3_name(module: str, name: str) -> str:
    """``__builtin__.print`` (how protocol 2 spells it) -> ``builtins.print``."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


def can_stand_in(value: object) -> bool:
    """Whether instances of ``value`` may receive ``BUILD``: a class made by a class
    statement, with a plain metaclass, that can be subclassed and whose instances can change
    ``__class__`` (enums, builtin and C types cannot)."""
    if not isinstance(value, type) or type(value) is not type:
        return False
    flags = value.__flags__
    return bool(flags & _HEAPTYPE and flags & _BASETYPE and not flags & _IMMUTABLETYPE)


def _check_state(cls: type, state: Any) -> None:
    """Refuse ``BUILD`` state keys (of the state dict or the slot-state dict) that are not
    ``str`` or that start with ``__``."""
    sources = state if isinstance(state, tuple) and len(state) == 2 else (state,)
    for source in sources:
        if isinstance(source, dict):
            for key in source:
                if type(key) is not str:
                    raise ValueError(f"BUILD state has a key that is not a str: {key!r}")
                if key.startswith("__"):
                    raise DisallowedAttribute(cls, key)


def _set_attributes(obj: Any, state: Any) -> None:
    """``BUILD`` without a ``__setstate__``: the state's items (and the slot state's, when
    it is a pair) set as attributes."""
    sources = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
    for source in sources:
        if source:
            if not isinstance(source, dict):
                raise ValueError("BUILD state is not a dict")
            for key, value in source.items():
                object.__setattr__(obj, key, value)


def _stand_in(cls: type, made: list[tuple[object, type]]) -> type:
    """A subclass of ``cls`` with the same layout whose instances check their ``BUILD``;
    each instance it makes is recorded in ``made`` (to become a ``cls`` again).

    ``BUILD`` calls ``cls``'s own ``__setstate__`` (never one found on the instance), else
    sets the state's items as attributes, after :func:`_check_state`."""
    make: Callable[..., Any] = cls.__new__
    own: Callable[[Any, Any], None] | None = getattr(cls, "__setstate__", None)

    def __new__(stand_in: type, *args: Any) -> Any:
        obj = object.__new__(stand_in) if make is object.__new__ else make(stand_in, *args)
        if type(obj) is not stand_in:
            raise ValueError(f"{cls.__module__}.{cls.__qualname__} did not make a new object")
        made.append((obj, cls))
        return obj

    def build(obj: Any, state: Any) -> None:
        _check_state(cls, state)
        if own is not None:
            own(obj, state)
        else:
            _set_attributes(obj, state)

    def setstate(obj: Any) -> Callable[[Any], None]:
        return functools.partial(build, obj)

    namespace = {
        "__slots__": (), "__new__": __new__, "__setstate__": property(setstate),
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
    }  # fmt: skip
    return type(cls.__name__, (cls,), namespace)


class AllowlistUnpickler(pickle.Unpickler):
    """Unpickles ``data``, whose opcodes were surveyed, resolving globals through ``allowed``.

    ``names`` holds the name each ``GLOBAL``/``STACK_GLOBAL`` opcode resolves, in stream order
    (as the survey read them); the opcodes at the positions in ``stand_ins`` get a stand-in
    class instead of the allowed class (see the module docstring). Persistent ids are refused.
    """

    def __init__(
        self, data: bytes, allowed: Mapping[str, object], names: Sequence[str], stand_ins: Set[int]
    ) -> None:
        super().__init__(io.BytesIO(data), encoding="latin1")
        self._allowed = allowed
        self._names = names
        self._stand_in_at = stand_ins
        self._found = 0
        self._made: list[tuple[object, type]] = []
        self._stand_ins: dict[type, type] = {}

    def find_class(self, module: str, name: str) -> Any:
        full = python3_name(module, name)
        if full not in self._allowed:
            raise DisallowedGlobal(full)
        at = self._found
        self._found += 1
        if at >= len(self._names) or self._names[at] != full:
            raise ValueError(f"malformed pickle: global {full} was not found by the survey")
        value = self._allowed[full]
        if at not in self._stand_in_at or not isinstance(value, type) or not can_stand_in(value):
            return value
        if value not in self._stand_ins:
            self._stand_ins[value] = _stand_in(value, self._made)
        return self._stand_ins[value]

    def persistent_load(self, pid: Any) -> Any:
        raise ValueError("pickle opcode BINPERSID is not supported")

    def load_restored(self) -> Any:
        """``load()``, then every stand-in's instance made an instance of its real class.
        Damage the C unpickler finds is a ``ValueError``; errors raised by the allowed
        callables themselves propagate unchanged."""
        try:
            return self.load()
        except pickle.UnpicklingError as exc:
            raise ValueError(f"malformed pickle: {exc}") from exc
        finally:  # also when the load failed: no stand-in outlives it, wherever it went
            for made, cls in self._made:
                if type(made) is self._stand_ins[cls]:
                    object.__setattr__(made, "__class__", cls)
