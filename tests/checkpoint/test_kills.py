"""Real kills at each named point of a save (statekeeper/checkpoint/points.py).

The run directory holds step 0; a child process saves step 1 and SIGKILLs itself exactly at
one point of that save (``STATEKEEPER_TEST_KILL_AT``), blocking or through an asynchronous
Checkpointer (the background thread reaches the point). What is left is checked point by
point: before the commit the newest step is 0, loadable, and the interrupted save is one
partial entry that ``remove_partial`` clears and after which step 1 saves again; from the
commit on, step 1 is committed and nothing partial is left.

The children are forked from a pre-started interpreter (tests/helpers/launcher.py): each is
a process of its own, really SIGKILLed; only the seconds of importing torch are saved.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import launcher
from tests.helpers.saver import state_for

import statekeeper as sk
from statekeeper.checkpoint.points import KILL_AT, Point
from statekeeper.testing import assert_state_equal

ROOT = Path(__file__).resolve().parents[2]
SHARD_BYTES = 100_000  # tests/helpers/saver.py's: state_for(step) is several tensor files

BEFORE_COMMIT = ["begun", "shard-written", "shard-written:2", "tensors-written", "manifest-written"]


def _killed_saving_step_1(run: Path, kill_at: str, mode: str) -> list[str]:
    """Save step 0 here, then step 1 in a child killed at ``kill_at``; the child's output."""
    sk.save(run, state_for(0), step=0, shard_bytes=SHARD_BYTES)
    child = launcher.Popen(
        [sys.executable, "-m", "tests.helpers.saver", str(run), "1", mode, "all", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, KILL_AT: kill_at},
    )
    out, _ = child.communicate()
    assert child.returncode == -9, f"not killed at {kill_at}: exit {child.returncode}, {out!r}"
    assert "done" not in out
    return out.split()


def _read(run: Path, step: int) -> dict[str, object]:
    saved = dict(sk.read(run, step=step))
    saved.pop("rng", None)  # a Checkpointer's save adds the RNG state
    return saved


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kill_at", BEFORE_COMMIT)
def test_a_kill_before_the_commit_leaves_the_previous_step_and_one_partial_entry(
    tmp_path: Path, kill_at: str, mode: str
) -> None:
    out = _killed_saving_step_1(tmp_path, kill_at, mode)
    if mode == "sync":  # a blocking save reports its step once committed only
        assert out == ["ready"]
    infos = sk.list_checkpoints(tmp_path)
    assert [i.step for i in infos] == [0] and infos[0].error is None
    assert_state_equal(_read(tmp_path, 0), state_for(0))
    assert len(sk.audit.list_partial(tmp_path)) == 1, "the interrupted save of step 1 is partial"
    sk.audit.remove_partial(tmp_path)  # the dead writer's lock is gone with it
    assert sk.audit.list_partial(tmp_path) == []
    sk.save(tmp_path, state_for(1), step=1, shard_bytes=SHARD_BYTES)  # not StepExistsError
    assert [i.step for i in sk.list_checkpoints(tmp_path)] == [0, 1]
    assert_state_equal(_read(tmp_path, 1), state_for(1))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kill_right_after_the_commit_leaves_the_new_step_committed(
    tmp_path: Path, mode: str
) -> None:
    out = _killed_saving_step_1(tmp_path, Point.COMMITTED.value, mode)
    if mode == "sync":  # killed before the save returned
        assert out == ["ready"]
    infos = sk.list_checkpoints(tmp_path)
    assert [i.step for i in infos] == [0, 1] and all(i.error is None for i in infos)
    assert_state_equal(_read(tmp_path, 1), state_for(1))
    assert_state_equal(sk.read(tmp_path, step=0), state_for(0))
    assert sk.audit.list_partial(tmp_path) == []


def test_a_kill_at_a_later_save_leaves_every_earlier_step(tmp_path: Path) -> None:
    """``<point>:<n>``: the second save of the child (step 2) is the one killed."""
    out = _killed_saving_step_1(tmp_path, f"{Point.MANIFEST_WRITTEN.value}:2", "sync")
    assert out == ["ready", "1"]
    assert [i.step for i in sk.list_checkpoints(tmp_path)] == [0, 1]
    assert_state_equal(sk.read(tmp_path), state_for(1))
    assert len(sk.audit.list_partial(tmp_path)) == 1
