"""mkdocs hook (mkdocs.yml `hooks:`): the API reference under docs/reference/ must document
every name of `statekeeper.__all__` exactly once. A missing or doubled name is a warning,
which `mkdocs build --strict` (scripts/check) turns into a failure."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.statekeeper")

_DIRECTIVE = re.compile(r"^::: statekeeper\.(\w+)\s*$", re.MULTILINE)
_NOT_RENDERED = {"__version__"}


def _public_names(init: Path) -> list[str]:
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [str(v) for v in ast.literal_eval(node.value)]
    raise RuntimeError(f"no __all__ in {init}")


def on_pre_build(config: Any, **kwargs: Any) -> None:
    root = Path(config["config_file_path"]).parent
    names = set(_public_names(root / "src" / "statekeeper" / "__init__.py")) - _NOT_RENDERED
    found: dict[str, list[str]] = {}
    for page in sorted(Path(config["docs_dir"], "reference").glob("*.md")):
        for name in _DIRECTIVE.findall(page.read_text()):
            found.setdefault(name, []).append(page.name)
    for name in sorted(names - found.keys()):
        log.warning(f"API reference: statekeeper.{name} (in __all__) is on no docs/reference page")
    for name, pages in sorted(found.items()):
        if len(pages) > 1:
            log.warning(f"API reference: statekeeper.{name} is on several pages: {pages}")
