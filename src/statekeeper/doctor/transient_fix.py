"""``statekeeper doctor --fix-transient``: the declarations that let ``clear_state`` free
what the doctor's SK004 and SK005 find.

The two rules run on the factory's model (each on a fresh instance). Every tensor attribute
a forward leaves behind (SK004) goes into its class's ``statekeeper_transient``, or into
``statekeeper_borrowed`` when it holds the module's own input (an identity-like cache: it
must be dropped, never emptied), and every persistent buffer holding per-batch state
(SK005) into ``statekeeper_batch_state``; merged with what the class already declares,
classes grouped whatever paths they sit at. A class that is not the user's to edit (torch's,
a library's) gets the same declarations as assignments made from the user's code.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from statekeeper.doctor.finding import Finding, Report
from statekeeper.doctor.kept_inputs import kept_inputs
from statekeeper.doctor.rules.batch_state import BatchState
from statekeeper.doctor.rules.transient_tensors import TransientTensors
from statekeeper.doctor.run import run
from statekeeper.doctor.target import build_target

__all__ = ["ClassFix", "TransientFix", "fix_transient"]

_DECLARATIONS = {"SK004": "statekeeper_transient", "SK005": "statekeeper_batch_state"}
_NAMES = ("statekeeper_transient", "statekeeper_borrowed", "statekeeper_batch_state")


@dataclass(frozen=True)
class ClassFix:
    """What one class should declare (everything it should list: what it already lists and
    what the doctor found), and where instances of it sit in the model."""

    cls: str  # module.qualname
    source: str | None  # file:line of the class, when known
    declarations: dict[str, tuple[str, ...]]  # statekeeper_transient etc. -> names
    added: tuple[str, ...]  # the names the doctor found that the class does not list yet
    paths: tuple[str, ...]
    library: bool  # defined by torch or an installed package: declared from outside

    def code(self) -> str:
        name = self.cls.rpartition(".")[2]
        found = [(attr, names) for attr, names in self.declarations.items() if names]
        if self.library:
            lines = [f"# {name} is {self.cls}, not yours to edit: declare it from your code"]
            lines.append(f"# at {', '.join(self.paths)}")
            lines.extend(f"{name}.{attr} = {tuple(names)!r}" for attr, names in found)
            return "\n".join(lines)
        where = f"  # {self.source}" if self.source else ""
        lines = [f"class {name}(...):{where}", f"    # at {', '.join(self.paths)}"]
        lines.extend(f"    {attr} = {tuple(names)!r}" for attr, names in found)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.cls, "source": self.source, "library": self.library,
            **{k.removeprefix("statekeeper_"): list(v) for k, v in self.declarations.items()},
            "added": list(self.added), "paths": list(self.paths),
        }  # fmt: skip


@dataclass(frozen=True)
class TransientFix:
    """The classes to change, and the doctor report the two rules gave."""

    target: str
    classes: tuple[ClassFix, ...]
    report: Report
    calibration: tuple[str, ...] = ()  # SK005 buffers filled or reshaped by use: not proposed

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
        if any(c.declarations["statekeeper_batch_state"] for c in self.classes):
            return (
                "statekeeper.clearing.clear_state(\n"
                "    model, include=statekeeper.clearing.ClearInclude.BATCH_STATE, "
                "like=fresh_model\n"
                ")  # fresh_model: built as the model was"
            )
        return "statekeeper.clearing.clear_state(model)"

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
            "not_proposed": list(self.calibration),
            "skipped": [{"rule": r, "reason": why} for r, why in self.report.skipped],
        }


def _source(cls: type) -> tuple[str | None, bool]:
    """file:line of the class, and whether it is a library's (torch's, an installed
    package's) rather than the user's."""
    library = cls.__module__.split(".")[0] == "torch"
    try:
        file = inspect.getsourcefile(cls)
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):  # built in, or defined where no source is kept
        return None, library
    if file is None:
        return None, library
    library = library or any(part in file for part in ("site-packages", "dist-packages"))
    return f"{file}:{line}", library


def _calibrating(module: torch.nn.Module) -> bool:
    """A quantization observer or fake-quantize module: its statistics are calibration."""
    try:
        from torch.ao.quantization import FakeQuantizeBase, ObserverBase
    except ImportError:  # a torch without torch.ao
        return False
    return isinstance(module, ObserverBase | FakeQuantizeBase)


def _follows_batch(module: torch.nn.Module, finding: Finding) -> bool:
    """Whether an SK005 buffer holds per-batch state rather than the model's own: a
    ``(batch, features...)`` buffer (two dimensions or more) whose ``__init__`` value is not
    empty and whose leading dimension alone may move (a (1, N) membrane that became (B, N));
    a calibration observer's ``min_val`` (a scalar, or empty and then filled) or a
    per-channel scale ((1,) then (C,)) is the model's."""
    init = module._buffers.get(finding.tensor)
    if init is None or init.numel() == 0 or finding.shape is None or _calibrating(module):
        return False
    shape = tuple(init.shape)
    return len(shape) == len(finding.shape) >= 2 and shape[1:] == finding.shape[1:]


def fix_transient(factory: Callable[[], Any], *, spec: str | None = None) -> TransientFix:
    """Run SK004 and SK005 on what ``factory`` builds; the declarations each class needs."""
    target = build_target(factory, spec=spec)
    report = run(target, rules=(TransientTensors(), BatchState()), spec=spec)
    modules = dict(target.model.named_modules()) if target.model is not None else {}
    kept = kept_inputs(target) if any(f.rule == "SK004" for f in report.findings) else set()
    found: dict[type, dict[str, list[str]]] = {}
    skipped: list[str] = []
    for f in report.findings:
        declaration = _DECLARATIONS.get(f.rule)
        path = f.module
        if path is None or path not in modules or declaration is None or not f.tensor:
            continue  # an INFO finding (no fresh instance), or nothing to declare
        if (path, f.tensor) in kept:
            declaration = "statekeeper_borrowed"
        if f.rule == "SK005" and not _follows_batch(modules[path], f):
            skipped.append(f"{f.tensor} of {type(modules[path]).__qualname__}")
            continue
        entry = found.setdefault(type(modules[path]), {"paths": []})
        names = entry.setdefault(declaration, [])
        if f.tensor not in names:
            names.append(f.tensor)
        entry["paths"].append(f"model.{path}" if path else "model")
    classes = []
    for cls, entry in found.items():
        declarations: dict[str, tuple[str, ...]] = {}
        added: list[str] = []
        for declaration in _NAMES:
            has = getattr(cls, declaration, ())
            has = (has,) if isinstance(has, str) else tuple(has)
            new = [n for n in entry.get(declaration, []) if n not in has]
            declarations[declaration] = (*has, *new)
            added.extend(new)
        source, library = _source(cls)
        classes.append(ClassFix(
            f"{cls.__module__}.{cls.__qualname__}", source, declarations, tuple(added),
            tuple(dict.fromkeys(entry["paths"])), library,
        ))  # fmt: skip
    return TransientFix(report.target, tuple(classes), report, tuple(dict.fromkeys(skipped)))
