"""What every rule's class shares: its identity, declared once in the class statement.

``class BatchState(DoctorRule, id="SK005", severity=Severity.ERROR, needs=RUNS_MODEL)``
with a ``summary`` class attribute is a :class:`~statekeeper.doctor.rule.Rule`; the
keywords are checked when the class is made, so a rule missing one fails at import, not
in a diagnosis. :class:`FreshModelRule` adds the probe of a model the factory builds anew.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Need, Target
from statekeeper.doctor.rules._probe import fresh_model, isolated_rng, not_fresh

__all__ = ["BUILDS_MODEL", "MODEL", "NOTHING", "RUNS_MODEL", "SPEC", "DoctorRule", "FreshModelRule"]

NOTHING: frozenset[Need] = frozenset()
"""A rule that looks only at the named objects of the state (data loaders...)."""
MODEL = frozenset({Need.MODEL})
"""A rule that reads the model's state_dict."""
BUILDS_MODEL = frozenset({Need.MODEL, Need.FACTORY})
"""A rule that builds fresh instances of the model."""
RUNS_MODEL = frozenset({Need.MODEL, Need.FACTORY, Need.INPUT})
"""A rule that builds fresh instances and calls them on the example input."""
SPEC = frozenset({Need.SPEC})
"""A rule that builds the model in child processes, through 'module:function'."""

_ID = re.compile(r"SK\d{3}")


class DoctorRule:
    """A doctor rule: ``id``, ``severity`` and ``needs`` are class keywords, ``summary`` a
    class attribute, ``check(target)`` yields the findings. A class without ``id`` is a base
    of rules, not a rule."""

    id: str
    summary: str
    severity: Severity
    needs: frozenset[Need]

    def __init_subclass__(
        cls,
        *,
        id: str | None = None,
        severity: Severity = Severity.ERROR,
        needs: frozenset[Need] = NOTHING,
        **kwargs: object,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if id is None:  # a base of rules (FreshModelRule), not a rule
            return
        if not _ID.fullmatch(id):
            raise ValueError(f"rule {cls.__name__}: id {id!r} is not of the form SKnnn")
        if not isinstance(vars(cls).get("summary"), str):
            raise TypeError(f"rule {cls.__name__} ({id}): give it a one-line `summary`")
        cls.id, cls.severity, cls.needs = id, severity, needs

    def check(self, target: Target) -> Iterable[Finding]:
        raise NotImplementedError(f"{type(self).__name__}.check")


class FreshModelRule(DoctorRule):
    """A rule that probes a model the factory builds anew, with every global generator
    restored afterwards; when the factory returns the target's own model the rule is
    skipped with a note (:func:`~statekeeper.doctor.rules._probe.not_fresh`)."""

    def check(self, target: Target) -> Iterator[Finding]:
        with isolated_rng():  # the findings are made inside too: the caller sees them after
            built = fresh_model(target)
            findings = [not_fresh(self.id)] if built is None else list(self.probe(*built))
        yield from findings

    def probe(self, fresh: Target, model: torch.nn.Module) -> Iterable[Finding]:
        """The findings on ``model``, built by ``fresh``'s factory (``fresh.call`` runs it)."""
        raise NotImplementedError(f"{type(self).__name__}.probe")
