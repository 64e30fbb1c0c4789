"""The rules' shared opening (doctor/rules/_base.py): identity as class keywords, checked
when the class is made; the fresh-model probe with its skip note."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Need, Target
from statekeeper.doctor.rules import RULES
from statekeeper.doctor.rules._base import RUNS_MODEL, DoctorRule, FreshModelRule


def test_every_rule_declares_its_identity_once() -> None:
    ids = [rule.id for rule in RULES]
    assert len(set(ids)) == len(ids) == 12
    for rule in RULES:
        assert isinstance(rule, DoctorRule)
        assert rule.summary and isinstance(rule.severity, Severity)
        assert all(isinstance(n, Need) for n in rule.needs)


def test_a_rule_without_summary_or_with_a_bad_id_fails_when_defined() -> None:
    with pytest.raises(TypeError, match="summary"):

        class NoSummary(DoctorRule, id="SK099", severity=Severity.ERROR):
            pass

    with pytest.raises(ValueError, match="SKnnn"):

        class BadId(DoctorRule, id="X1", severity=Severity.ERROR):
            summary = "bad"


class _Counts(FreshModelRule, id="SK098", severity=Severity.WARNING, needs=RUNS_MODEL):
    summary = "counts the fresh model's parameters"

    def probe(self, fresh: Target, model: torch.nn.Module) -> Iterator[Finding]:
        yield Finding(self.id, self.severity, "model", f"{len(list(model.parameters()))}", "")


def test_fresh_model_rule_probes_a_fresh_model_and_notes_a_shared_one() -> None:
    fresh = Target.build(lambda: torch.nn.Linear(2, 2))
    [found] = _Counts().check(fresh)
    assert (found.rule, found.severity, found.problem) == ("SK098", Severity.WARNING, "2")

    same = torch.nn.Linear(2, 2)
    [note] = _Counts().check(Target.build(lambda: same))
    assert note.severity is Severity.INFO and "skipped" in note.problem
