"""The named points of a save (statekeeper/checkpoint/points.py), in the test's own process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import statekeeper as sk
from statekeeper.checkpoint import points
from statekeeper.checkpoint.points import KILL_AT, Point


@pytest.fixture
def seen() -> Iterator[list[Point]]:
    reached: list[Point] = []
    previous = points.set_hook(reached.append)
    yield reached
    points.set_hook(previous)


def test_a_save_passes_the_points_in_order(tmp_path: Path, seen: list[Point]) -> None:
    state = {"a": torch.zeros(1000), "b": torch.ones(1000)}
    sk.save(tmp_path, state, step=1, shard_bytes=4000)  # one tensor file each
    assert seen == [
        Point.BEGUN,
        Point.SHARD_WRITTEN,
        Point.SHARD_WRITTEN,
        Point.TENSORS_WRITTEN,
        Point.MANIFEST_WRITTEN,
        Point.COMMITTED,
    ]


def test_retention_passes_removing_once_per_step(tmp_path: Path, seen: list[Point]) -> None:
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1)) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, {"x": torch.zeros(3)})
    assert seen.count(Point.REMOVING) == 2
    assert seen.count(Point.COMMITTED) == 3


def test_a_failing_hook_before_the_commit_commits_nothing(tmp_path: Path) -> None:
    def fail(point: Point) -> None:
        if point is Point.MANIFEST_WRITTEN:
            raise KeyboardInterrupt  # stands for anything that stops the save there

    previous = points.set_hook(fail)
    try:
        with pytest.raises(KeyboardInterrupt):
            sk.save(tmp_path, {"x": torch.zeros(3)}, step=1)
    finally:
        points.set_hook(previous)
    assert sk.list_checkpoints(tmp_path) == []
    assert sk.audit.list_partial(tmp_path) == []  # the save cleaned up after itself


def test_a_bad_kill_spec_names_the_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KILL_AT, "halfway")
    with pytest.raises(sk.errors.InvalidArgumentError, match="manifest-written") as caught:
        sk.save(tmp_path, {"x": torch.zeros(3)}, step=1)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("spec", ["begun:0", "begun:-5", "begun:two"])
def test_a_kill_count_below_one_is_refused_not_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    monkeypatch.setenv(KILL_AT, spec)
    with pytest.raises(sk.errors.InvalidArgumentError, match="positive integer"):
        sk.save(tmp_path, {"x": torch.zeros(3)}, step=1)
    assert sk.list_checkpoints(tmp_path) == []
