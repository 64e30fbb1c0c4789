"""The API reference's sections: every public function of ``statekeeper`` and of its
namespaces (``sk.errors``, ``sk.training``, ``sk.storage``, ...), and every public method of
their public classes that has a docstring of its own (``Checkpointer``'s included), documents
its parameters (``Args:``) and, when it returns something, what (``Returns:``), in the google
style that mkdocs.yml declares. Parsed by griffe as the documentation site parses them; the
strict build (scripts/check) then fails on an ``Args:`` entry that names no parameter."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import statekeeper

griffe = pytest.importorskip("griffe")  # the docs extra
ROOT = Path(__file__).resolve().parents[1]


def _package() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        # (typing) scripts/ is not a package: the test puts it on sys.path
        from griffe_roles import SphinxRoles  # type: ignore[import-not-found]  # scripts/ is put on the path just above
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return griffe.load(
        "statekeeper",
        search_paths=[str(ROOT / "src")],
        docstring_parser="google",
        extensions=griffe.load_extensions(SphinxRoles),
    )


def _missing(label: str, fn: Any) -> list[str]:
    kinds = {s.kind for s in (fn.docstring.parse("google") if fn.docstring else [])}
    params = [p.name for p in fn.parameters if p.name not in ("self", "cls")]
    problems = []
    if params and griffe.DocstringSectionKind.parameters not in kinds:
        problems.append(f"{label}: no Args: section for {', '.join(params)}")
    returns = fn.returns
    returns_something = returns is not None and str(returns) != "None"
    if returns_something and griffe.DocstringSectionKind.returns not in kinds:
        problems.append(f"{label}: no Returns: section")
    return problems


def test_public_functions_and_checkpointer_methods_have_args_and_returns() -> None:
    pkg = _package()
    problems: list[str] = []
    for name in statekeeper.__all__:
        obj = pkg.members.get(name)
        if obj is None:
            continue
        target = obj.final_target if obj.is_alias else obj
        if target.is_function:
            problems += _missing(name, target)
    checkpointer = pkg.members["Checkpointer"].final_target
    for name, member in checkpointer.members.items():
        if not name.startswith("_") and member.is_function:
            problems += _missing(f"Checkpointer.{name}", member)
    assert problems == [], "\n".join(problems)


NAMESPACES = (
    "errors",
    "training",
    "audit",
    "conversion",
    "clearing",
    "averaging",
    "data",
    "distributed",
    "storage",
    "testing",
    "doctor",
)


def _missing_in(label: str, obj: Any) -> list[str]:
    """A function's gaps, or for a class those of each public method with its own docstring."""
    target = obj.final_target if obj.is_alias else obj
    if target.is_function:
        return _missing(label, target)
    problems: list[str] = []
    if target.is_class:
        for name, member in target.members.items():
            method = member.final_target if member.is_alias else member
            if not name.startswith("_") and method.is_function and method.docstring is not None:
                problems += _missing(f"{label}.{name}", method)
    return problems


def test_every_public_callable_in_root_and_namespaces_has_args_and_returns() -> None:
    pkg = _package()
    problems: list[str] = []
    for ns in ("", *NAMESPACES):
        module = pkg.members[ns] if ns else pkg
        module = module.final_target if module.is_alias else module
        names = getattr(statekeeper, ns).__all__ if ns else statekeeper.__all__
        for name in names:
            label = f"{ns}.{name}" if ns else name
            obj = module.members.get(name)
            if obj is None:
                problems.append(f"{label}: not found by griffe")
                continue
            problems += _missing_in(label, obj)
    assert problems == [], "\n".join(problems)
