"""``statekeeper doctor --fix-transient``: the declarations that let ``clear_state`` free
what the doctor's SK004 and SK005 find.

The two rules run on the factory's model (each on a fresh instance). Every tensor attribute
a forward leaves behind (SK004) goes into its class's ``statekeeper_transient``, every
persistent buffer holding per-batch state (SK005) into ``statekeeper_batch_state``, merged
with what the class already declares; classes are grouped, whatever paths they sit at.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statekeeper.doctor.finding import Report
from statekeeper.doctor.rules.batch_state import BatchState
from statekeeper.doctor.rules.transient_tensors import TransientTensors
from statekeeper.doctor.run import run
from statekeeper.doctor.target import build_target

__all__ = ["ClassFix", "TransientFix", "fix_transient"]

_DECLARATIONS = {"SK004": "statekeeper_transient", "SK005": "statekeeper_batch_state"}


@dataclass(frozen=True)
class ClassFix:
    """What one class should declare (everything it should list: what it already lists and
    what the doctor found), and where instances of it sit in the model."""

    cls: str  # module.qualname
    source: str | None  # file:line of the class, when known
    transient: tuple[str, ...]
    batch_state: tuple[str, ...]
    added: tuple[str, ...]  # the names the doctor found that the class does not list yet
    paths: tuple[str, ...]

    def code(self) -> str:
        where = f"  # {self.source}" if self.source else ""
        lines = [f"class {self.cls.rpartition('.')[2]}(...):{where}"]
        lines.append(f"    # at {', '.join(self.paths)}")
        for attr, names in (
            ("statekeeper_transient", self.transient),
            ("statekeeper_batch_state", self.batch_state),
        ):
            if names:
                lines.append(f"    {attr} = {tuple(names)!r}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.cls, "source": self.source, "transient": list(self.transient),
            "batch_state": list(self.batch_state), "added": list(self.added),
            "paths": list(self.paths),
        }  # fmt: skip


@dataclass(frozen=True)
class TransientFix:
    """The classes to change, and the doctor report the two rules gave."""

    target: str
    classes: tuple[ClassFix, ...]
    report: Report

    @property
    def checked(self) -> bool:
        """Whether both rules looked at a fresh instance (they need an example input and a
        factory that builds a new model on every call)."""
        ran = {r for r, _ in self.report.rules} - {r for r, _ in self.report.skipped}
        fresh = not any(f.rule in ran and f.tensor == "" for f in self.report.findings)
        return ran == set(_DECLARATIONS) and fresh

    @property
    def call(self) -> str:
        """The call to make before saving or exporting the whole module: per-batch buffers
        go back to what ``__init__`` made (their shape too) only with a fresh instance."""
        if any(c.batch_state for c in self.classes):
            return (
                "statekeeper.clear_state(model, include=statekeeper.ClearInclude.BATCH_STATE, "
                "like=fresh_model)  # fresh_model: built as the model was"
            )
        return "statekeeper.clear_state(model)"

    def code(self) -> str:
        blocks = [c.code() for c in self.classes if c.added]
        return "\n\n".join(blocks)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "classes": [c.to_json() for c in self.classes],
            "code": self.code(),
            "call": self.call if self.classes else None,
            "checked": self.checked,
            "skipped": [{"rule": r, "reason": why} for r, why in self.report.skipped],
        }


def _source(cls: type) -> str | None:
    try:
        file = inspect.getsourcefile(cls)
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):  # built in, or defined where no source is kept
        return None
    return f"{file}:{line}" if file else None


def fix_transient(factory: Callable[[], Any], *, spec: str | None = None) -> TransientFix:
    """Run SK004 and SK005 on what ``factory`` builds; the declarations each class needs."""
    target = build_target(factory, spec=spec)
    report = run(target, rules=(TransientTensors(), BatchState()), spec=spec)
    modules = dict(target.model.named_modules()) if target.model is not None else {}
    found: dict[type, dict[str, list[str]]] = {}
    for f in report.findings:
        declaration = _DECLARATIONS.get(f.rule)
        path = f.module
        if path is None or path not in modules or declaration is None or not f.tensor:
            continue  # an INFO finding (no fresh instance), or nothing to declare
        entry = found.setdefault(type(modules[path]), {"paths": []})
        entry.setdefault(declaration, [])
        if f.tensor not in entry[declaration]:
            entry[declaration].append(f.tensor)
        entry["paths"].append(f"model.{path}" if path else "model")
    classes = []
    for cls, entry in found.items():
        names: dict[str, tuple[str, ...]] = {}
        added: list[str] = []
        for declaration in _DECLARATIONS.values():
            has = getattr(cls, declaration, ())
            has = (has,) if isinstance(has, str) else tuple(has)
            new = [n for n in entry.get(declaration, []) if n not in has]
            names[declaration] = (*has, *new) if new or has else ()
            added.extend(new)
        classes.append(ClassFix(
            f"{cls.__module__}.{cls.__qualname__}", _source(cls),
            names["statekeeper_transient"], names["statekeeper_batch_state"],
            tuple(added), tuple(dict.fromkeys(entry["paths"])),
        ))  # fmt: skip
    return TransientFix(report.target, tuple(classes), report)
