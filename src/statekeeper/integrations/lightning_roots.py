"""Which Lightning package a plugin, callback or strategy belongs to.

Lightning ships twice: ``pytorch_lightning`` (with ``lightning_fabric``) and the unified
``lightning`` package (``lightning.pytorch``, ``lightning.fabric``), each with classes of its
own. A ``Trainer`` refuses a callback or plugin of the other package ("invalid type"), so
statekeeper's classes are made, when one is made, as subclasses of the Lightning class of
the package(s) this process has imported (:func:`made`): ``StatekeeperCallback()`` after
``import lightning as L`` is an ``L.Callback``, after ``import pytorch_lightning as pl`` a
``pl.Callback``, and with both imported an instance of both (its hooks are the same for
either Trainer). A strategy runs its package's own internals, so it belongs to exactly one:
with both imported it is named (``StatekeeperModelParallelStrategy.of("lightning")``).
When neither is imported yet, the installed one is imported (``pytorch_lightning`` first).

The statekeeper classes themselves (``StatekeeperCallback``...) are package-free fronts: what
they do reads Lightning's objects by their attributes, never by one package's types. With
one package installed (the common case) each module binds the public name to the front
made of that package at import (:func:`settled`), a real subclass; only with both installed
is the public name the front, made per instance.
"""

from __future__ import annotations

import copyreg
import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from statekeeper.errors import InvalidArgumentError

__all__ = [
    "ByPackage", "TRAINERS", "imported", "installed", "made", "package_of", "settled",
    "trainer_root",
]  # fmt: skip

TRAINERS = ("pytorch_lightning", "lightning.pytorch")
"""The two packages a ``Trainer`` comes from."""
_FABRIC = {"pytorch_lightning": "lightning_fabric", "lightning.pytorch": "lightning.fabric"}
_NAMES = {"pytorch_lightning": "pytorch_lightning", "lightning": "lightning.pytorch"}
_NAMES.update({"lightning.pytorch": "lightning.pytorch", "pytorch-lightning": "pytorch_lightning"})

T = TypeVar("T")


def trainer_root(name: str) -> str:
    """``"lightning"`` / ``"lightning.pytorch"`` / ``"pytorch_lightning"`` as a package in
    :data:`TRAINERS`."""
    root = _NAMES.get(name) if isinstance(name, str) else None
    if root is None:
        raise InvalidArgumentError(
            f"Lightning package {name!r} is not one statekeeper knows: pass "
            '"lightning" (import lightning as L) or "pytorch_lightning"'
        )
    return root


def imported(fabric: bool = False) -> tuple[str, ...]:
    """The Lightning packages (``Trainer`` ones, or with ``fabric`` the Fabric ones) this
    process has imported; when none is, the installed one, imported now."""

    def named(root: str) -> str:
        return _FABRIC[root] if fabric else root

    found = tuple(named(r) for r in TRAINERS if sys.modules.get(named(r)) is not None)
    if found:
        return found
    for root in TRAINERS:
        try:
            importlib.import_module(named(root))
        except ImportError:
            continue
        return (named(root),)
    raise InvalidArgumentError(
        "statekeeper's Lightning integration needs Lightning: pip install "
        "'statekeeper[lightning]' (pytorch-lightning) or lightning"
    )


def installed() -> tuple[str, ...]:
    """The ``Trainer`` packages (:data:`TRAINERS`) this process can import (found, not
    imported; one set to None in ``sys.modules`` is not)."""
    found = []
    for root in TRAINERS:
        try:
            spec = importlib.util.find_spec(root.split(".")[0])
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            found.append(root)
    return tuple(found)


def package_of(cls: type) -> str | None:
    """The ``Trainer`` package (:data:`TRAINERS`) whose ``LightningModule`` or
    ``LightningDataModule`` ``cls`` subclasses, or None."""
    for root in TRAINERS:
        module = sys.modules.get(root)
        if module is None:
            continue
        if isinstance(cls, type) and issubclass(
            cls, module.LightningModule | module.LightningDataModule
        ):
            return root
    return None


_MADE: dict[tuple[type, tuple[type, ...]], type] = {}


def made(front: type[T], bases: tuple[type, ...]) -> type[T]:
    """``front`` as a subclass of ``bases`` too (Lightning's classes), made once per pair."""
    key = (front, bases)
    if key not in _MADE:
        namespace: dict[str, Any] = {"__module__": front.__module__, "_statekeeper_made": True}
        namespace["_statekeeper_front"] = front
        namespace["__qualname__"] = front.__qualname__  # Lightning's callback state key
        cls = types.new_class(
            front.__name__, (front, *bases), exec_body=lambda ns: ns.update(namespace)
        )
        _MADE[key] = cls
    return _MADE[key]


def settled(front: type[T]) -> type[T]:
    """What a module binds ``front``'s public name to: with one Lightning package installed
    (the common case) the class made of it now, a real Lightning subclass that pickles by
    name and that jsonargparse's ``class_path`` and type checkers accept; with both, the
    front itself, made per instance of the imported package(s)."""
    if len(installed()) != 1:
        return front
    return made(front, front._lightning())  # type: ignore[attr-defined]


def _remake(front: type, bases: tuple[type, ...]) -> Any:
    """The unpickling of a :class:`ByPackage` instance (its class is made, not importable):
    a bare instance, whose state pickle then sets (Lightning's ``__setstate__`` if any)."""
    return object.__new__(made(front, bases))


class ByPackage:
    """A front class made, when an instance is made, as a subclass of the Lightning class
    its :attr:`_lightning` returns (see the module docstring)."""

    _lightning: ClassVar[Callable[[], tuple[type, ...]]]
    """The Lightning base classes an instance made now inherits."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if not getattr(cls, "_statekeeper_made", False):  # a subclass of a made one is made
            cls = made(cls, cls._lightning())
        return object.__new__(cls)

    def __reduce__(self) -> tuple[Any, ...]:
        cls = type(self)
        front = cls.__dict__.get("_statekeeper_front")
        module = sys.modules.get(cls.__module__)
        if front is None or getattr(module, cls.__qualname__, None) is cls:  # importable
            return (copyreg.__newobj__, (cls,), self.__getstate__())  # type: ignore[attr-defined]
        bases = tuple(b for b in cls.__bases__ if b is not front)
        # Lightning's own __getstate__/__setstate__ run (a Strategy drops its
        # _lightning_optimizers, which do not pickle, and remakes them)
        return (_remake, (front, bases), self.__getstate__())
