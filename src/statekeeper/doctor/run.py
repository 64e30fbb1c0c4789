"""Running every rule on a target: ``statekeeper.doctor.run``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from statekeeper.doctor.finding import Finding, Report
from statekeeper.doctor.rule import Need, Rule, Target
from statekeeper.doctor.rules import RULES
from statekeeper.doctor.target import build_target

__all__ = ["run"]


_HOW = {
    Need.MODEL: "needs a model: the factory must return an nn.Module (or a dict with model=)",
    Need.INPUT: (
        "needs an example input: return {'model': model, 'example_input': x} from the "
        "factory (x: a tensor, a tuple of arguments or a dict of keyword arguments)"
    ),
    Need.FACTORY: (
        "needs a factory that builds fresh instances: pass a function (or 'module:function' "
        "on the command line), not a built model"
    ),
    Need.SPEC: (
        "needs an importable factory: a module-level function ('module:function' on the "
        "command line), so that subprocesses can build it"
    ),
}
"""How to give a rule what it needs, for the report's list of skipped rules."""


def _spec_of(factory: Callable[[], Any]) -> str | None:
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return None
    return f"{module}:{qualname}"


def run(target: Any, *, rules: tuple[Rule, ...] = RULES, spec: str | None = None) -> Report:
    """Diagnose a factory (preferred: rules can build fresh instances), a module or a state dict.

    A factory returns an ``nn.Module`` or a dict with ``model``, optional ``optimizer`` and
    ``example_input``, and other state entries. Returns a :class:`Report`.
    """
    start = time.perf_counter()
    if isinstance(target, Target):
        subject = target
    elif callable(target) and not isinstance(target, torch.nn.Module):
        subject = build_target(target, spec=spec or _spec_of(target))
    else:
        subject = build_target(lambda: target)
        subject = Target(subject.state, subject.model, subject.optimizer, subject.example_input)
    findings: list[Finding] = []
    skipped: list[tuple[str, str]] = []
    for rule in rules:
        missing = [n for n in sorted(rule.needs) if not subject.has(n)]
        if missing:
            skipped.append((rule.id, "; ".join(_HOW[n] for n in missing)))
            continue
        findings.extend(rule.check(subject))
    if spec is None and callable(target) and not isinstance(target, torch.nn.Module):
        spec = _spec_of(target)
    name = spec or type(target).__name__
    return Report(name, tuple(findings), tuple((r.id, r.summary) for r in rules),
                  tuple(skipped), time.perf_counter() - start)  # fmt: skip
