"""The API reference's sections: every public function of ``statekeeper`` and every public
method of ``Checkpointer`` documents its parameters (``Args:``) and, when it returns
something, what (``Returns:``), in the google style that mkdocs.yml declares. Parsed by
griffe as the documentation site parses them; the strict build (scripts/check) then fails on
an ``Args:`` entry that names no parameter."""

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
