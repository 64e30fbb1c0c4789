"""mkdocs hook (mkdocs.yml `hooks:`): the API reference under docs/reference/ must document
every public name exactly once: each name of a namespace's `__all__` as
`statekeeper.<namespace>.<name>`, each other name of the root's `__all__` as
`statekeeper.<name>` (a root error is documented under `statekeeper.errors`). A missing or
doubled name is a warning, which `mkdocs build --strict` (scripts/check) turns into a
failure. tests/test_public_api.py checks the same against its reviewed list."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.statekeeper")

_DIRECTIVE = re.compile(r"^::: (statekeeper[\w.]*)\s*$", re.MULTILINE)
_NOT_RENDERED = {"__version__"}


def _literal(module: Path, name: str) -> list[str]:
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return [str(v) for v in ast.literal_eval(node.value)]
    raise RuntimeError(f"no {name} in {module}")


def public_names(src: Path) -> set[str]:
    """Every public name, spelled as the reference documents it."""
    names: set[str] = set()
    for namespace in _literal(src / "__init__.py", "_NAMESPACES"):
        module = src / namespace / "__init__.py"
        module = module if module.exists() else src / f"{namespace}.py"
        names |= {f"statekeeper.{namespace}.{n}" for n in _literal(module, "__all__")}
    root = set(_literal(src / "__init__.py", "__all__")) - _NOT_RENDERED
    errors = set(_literal(src / "errors.py", "__all__"))
    return names | {f"statekeeper.{n}" for n in root - errors}


def on_pre_build(config: Any, **kwargs: Any) -> None:
    root = Path(config["config_file_path"]).parent
    names = public_names(root / "src" / "statekeeper")
    found: dict[str, list[str]] = {}
    for page in sorted(Path(config["docs_dir"], "reference").glob("*.md")):
        for name in _DIRECTIVE.findall(page.read_text()):
            found.setdefault(name, []).append(page.name)
    for name in sorted(names - found.keys()):
        log.warning(f"API reference: {name} (public) is on no docs/reference page")
    for name, pages in sorted(found.items()):
        if len(pages) > 1:
            log.warning(f"API reference: {name} is on several pages: {pages}")
        if name not in names and not name.startswith(("statekeeper.integrations.",)):
            log.warning(f"API reference: {name} is documented but not public")
