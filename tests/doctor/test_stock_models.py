"""Stock models nobody here wrote get no warning and no error from the doctor.

A false alarm on a popular model costs the doctor its users' trust: GPT-2's output holds a
cache object and a ``ModelOutput``, which SK006 once took for nondeterminism.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tests.helpers import stock_models

from statekeeper.doctor.finding import Severity
from statekeeper.doctor.run import run

FACTORIES: dict[str, Callable[[], Any]] = {
    "gpt2": stock_models.gpt2,
    "bert": stock_models.bert,
    "llama": stock_models.llama,
    "t5": stock_models.t5,
    "gpt2-without-input": stock_models.gpt2_model,
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_stock_transformers_models_are_clean(name: str) -> None:
    report = run(FACTORIES[name])
    loud = [f for f in report.findings if f.severity is not Severity.INFO]
    assert loud == [], [f"{f.rule} {f.where}: {f.problem}" for f in loud]
    ran = {rule for rule, _ in report.rules} - {rule for rule, _ in report.skipped}
    assert {"SK002", "SK003", "SK007"} <= ran  # the subprocess rule ran too
    if name != "gpt2-without-input":
        assert {"SK004", "SK005", "SK006"} <= ran


def test_the_transformers_extra_is_installed() -> None:
    import transformers  # noqa: F401  (the stock-model suite above must never be skipped)
