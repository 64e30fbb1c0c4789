"""Names of a public module loaded on first use (PEP 562): the package root and ``sk.audit``
import nothing heavy until a name is asked for (``statekeeper ls`` never imports torch)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping, MutableMapping
from typing import Any

__all__ = ["listing", "loader"]


def loader(
    module: str,
    space: MutableMapping[str, Any],
    exports: Mapping[str, str],
    namespaces: Collection[str] = (),
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``module`` (whose globals are ``space``): a name of
    ``exports`` is imported from the module it maps to and kept in ``space``; a name of
    ``namespaces`` is the submodule ``module.<name>``."""

    def getattr_(name: str) -> Any:
        if name in namespaces:  # a submodule: importing it binds it in ``space`` too
            return importlib.import_module(f"{module}.{name}")
        source = exports.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        space[name] = value
        return value

    return getattr_


def listing(
    space: Mapping[str, Any], public: Collection[str], namespaces: Collection[str] = ()
) -> Callable[[], list[str]]:
    """The ``__dir__`` of a lazy module: its public names and namespaces (loaded or not) and
    its dunder attributes, not the private helpers or ``annotations`` it imports."""

    def dir_() -> list[str]:
        dunder = (n for n in space if n.startswith("__") and n.endswith("__"))
        return sorted({*public, *namespaces, *dunder})

    return dir_
