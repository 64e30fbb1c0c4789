"""Save and retention policies: validation, decisions, unions."""

from __future__ import annotations

from typing import Any

import pytest

import statekeeper as sk
from statekeeper.catalog.info import CheckpointInfo


def _infos(metrics: dict[int, float | None]) -> list[CheckpointInfo]:
    return [
        CheckpointInfo(step, f"step_{step}", 1, None, {} if m is None else {"val": m})
        for step, m in metrics.items()
    ]


RUN = _infos({10: 0.9, 20: 0.5, 30: 0.7, 40: None, 50: 0.6, 60: 0.8})


@pytest.mark.parametrize(
    ("policy", "kept"),
    [
        (sk.KeepLatest(1), {60}),
        (sk.KeepLatest(3), {40, 50, 60}),
        (sk.KeepLatest(100), {10, 20, 30, 40, 50, 60}),
        (sk.KeepBest(2, metric="val"), {20, 50}),
        (sk.KeepBest(1, metric="val", mode=sk.MetricGoal.MAX), {10}),
        (sk.KeepBest(2, metric="missing"), set()),
        (sk.KeepEvery(20), {20, 40, 60}),
        (sk.KeepLatest(1) | sk.KeepBest(1, metric="val"), {20, 60}),
        (
            sk.KeepEvery(30) | sk.KeepLatest(2) | sk.KeepBest(1, "val", sk.MetricGoal.MAX),
            {10, 30, 50, 60},
        ),
    ],
    ids=repr,
)
def test_retention_decisions(policy: sk.training.Retention, kept: set[int]) -> None:
    assert policy.keep(RUN) == kept


def test_best_ties_go_to_the_newer_step_and_nan_is_never_best() -> None:
    infos = _infos({1: 0.5, 2: 0.5, 3: float("nan")})
    assert sk.KeepBest(1, metric="val").keep(infos) == {2}


@pytest.mark.parametrize(
    ("policy", "saves"),
    [
        (sk.EverySteps(3), [0, 3, 6, 9]),
        (sk.AtSteps(1, 7), [1, 7]),
        (sk.EverySteps(5) | sk.AtSteps(7), [0, 5, 7, 10]),
    ],
    ids=repr,
)
def test_step_save_policies(policy: sk.training.SavePolicy, saves: list[int]) -> None:
    assert [s for s in range(11) if policy.should_save(s, 0.0)] == saves


def test_every_seconds_counts_from_the_last_save() -> None:
    policy = sk.EverySeconds(30)
    assert not policy.should_save(5, 29.9)
    assert policy.should_save(5, 30.0)


@pytest.mark.parametrize(
    "build",
    [
        lambda: sk.KeepLatest(0),
        lambda: sk.KeepLatest(2.5),
        lambda: sk.KeepBest(1, metric=""),
        lambda: sk.KeepBest(1, metric="loss", mode="min"),
        lambda: sk.KeepEvery(-1),
        lambda: sk.EverySteps(0),
        lambda: sk.EverySeconds(0),
        lambda: sk.EverySeconds(float("inf")),
        lambda: sk.AtSteps(-1),
    ],
)
def test_policies_are_validated_on_construction(build: Any) -> None:
    with pytest.raises(sk.errors.InvalidArgumentError):
        build()


def test_policies_are_frozen() -> None:
    policy = sk.KeepLatest(2)
    with pytest.raises(AttributeError):
        policy.n = 3


def test_keep_best_ranks_integers_too_large_for_a_float() -> None:
    from statekeeper.catalog.info import CheckpointInfo

    def info(step: int, loss: object) -> CheckpointInfo:
        # (typing) metrics as a CheckpointInfo read back holds them
        return CheckpointInfo(step, f"run/step_{step}", 0, None, metrics={"loss": loss})  # type: ignore[dict-item]

    huge = 10**4000  # what a crafted manifest can hold; float(huge) overflows
    infos = [info(1, huge), info(2, 0.5), info(3, -huge), info(4, float("nan")), info(5, True)]
    assert sk.KeepBest(2, metric="loss").keep(infos) == {3, 2}
    assert sk.KeepBest(1, metric="loss", mode=sk.MetricGoal.MAX).keep(infos) == {1}
