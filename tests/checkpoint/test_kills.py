"""Real kills: a process saving in a loop is SIGKILLed at random instants.

The saving processes are forked from a pre-started interpreter (tests/helpers/launcher.py): each
is a process of its own, really SIGKILLed; only the seconds of importing torch are saved.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import assert_state_equal
from tests.helpers import launcher
from tests.helpers.saver import state_for

import statekeeper as sk

KILLS = 30
ROOT = Path(__file__).resolve().parents[2]


def test_sigkill_at_random_instants_always_leaves_the_newest_committed_step_loadable(
    tmp_path: Path,
) -> None:
    rng = random.Random(1234)
    next_step = 0
    partial_seen = 0
    for kill in range(KILLS):
        child = launcher.Popen(
            [sys.executable, "-m", "tests.helpers.saver", str(tmp_path), str(next_step)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        # from its first commit on (however slow the machine is to get there), a random
        # kill instant: the verdicts below do not depend on how fast a save is
        assert child.stdout.readline().strip() == str(next_step)
        time.sleep(rng.uniform(0.0, 0.3))
        child.kill()
        child.wait()
        infos = sk.list_checkpoints(tmp_path)
        if not infos:
            continue  # killed before the first save committed
        newest = infos[-1]
        assert newest.error is None, f"kill {kill}: {newest.error}"
        assert_state_equal(sk.read(tmp_path), state_for(newest.step))
        partial_seen += len(sk.audit.list_partial(tmp_path))
        sk.audit.remove_partial(tmp_path)  # the dead writer's lock is gone with it
        assert sk.audit.list_partial(tmp_path) == []
        next_step = newest.step + 1
    steps = [i.step for i in sk.list_checkpoints(tmp_path)]
    assert steps == list(range(len(steps)))
    assert len(steps) >= KILLS // 2, "too few saves committed for the kills to mean anything"
    assert partial_seen > 0, "no kill landed mid-save; the test proved nothing"
