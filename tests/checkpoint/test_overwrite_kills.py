"""A real SIGKILL right after each rename of an overwriting save never loses the step.

The child (tests/helpers/rename_kill.py) saves step 5 again with ``overwrite=True`` and
SIGKILLs itself right after rename N of that save, for N = 1, 2, ... until a save makes
fewer renames than N: every instant between two renames is visited, deterministically. The
exchange mode uses ``renameat2(RENAME_EXCHANGE)`` of this file system; the fallback mode
stands for one without it (the exchange reports itself unsupported), which takes the
two-rename protocol. After each kill, ``load`` (by run and by step path), ``ls`` and
``Checkpointer.restore_latest`` find a complete step 5 (the old or the new state, never
an older step, never nothing), and no clean-up deletes it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.helpers import launcher
from tests.helpers.saver import state_for

import statekeeper as sk
from statekeeper.cli.main import main
from statekeeper.storage import commit
from statekeeper.testing import assert_state_equal

ROOT = Path(__file__).resolve().parents[2]
STEP = 5
ENTRY = "step_000000005"


def _kill_after(run: Path, n: int, mode: str, via: str) -> bool:
    """Run the child; True when it was killed after rename ``n``, False when it finished."""
    child = launcher.run(
        [sys.executable, "-m", "tests.helpers.rename_kill", str(run), str(STEP), str(n), mode, via],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if child.returncode == 0:
        assert child.stdout.startswith("done"), child.stdout
        return False
    assert child.returncode == -9, (child.returncode, child.stdout)
    return True


def _read(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """``sk.read`` without the Checkpointer's RNG entry (the child's Checkpointer adds it)."""
    return {k: v for k, v in sk.read(*args, **kwargs).items() if k != "rng"}


def _same(state: dict[str, Any], step: int) -> bool:
    try:
        assert_state_equal(state, state_for(step))
    except AssertionError:
        return False
    return True


def _ls(run: Path) -> tuple[dict[str, Any], str]:
    runner = CliRunner(env={"COLUMNS": "240"})
    data = json.loads(runner.invoke(main, ["ls", str(run), "--json"]).stdout)
    return data, runner.invoke(main, ["ls", str(run)]).stdout


@pytest.mark.parametrize("via", ["save", "checkpointer"])
@pytest.mark.parametrize("mode", ["exchange", "fallback"])
def test_a_kill_after_any_rename_of_an_overwrite_leaves_the_step_committed(
    tmp_path: Path, mode: str, via: str
) -> None:
    if mode == "exchange":
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        if not commit.exchange(tmp_path / "a", tmp_path / "b"):
            pytest.skip("this file system has no RENAME_EXCHANGE (the fallback mode runs)")
    seen = []
    n = 0
    while True:
        n += 1
        run = tmp_path / f"kill-{n}"
        sk.save(run, state_for(4), step=4, shard_bytes=100_000)
        sk.save(run, state_for(STEP), step=STEP, shard_bytes=100_000)
        if not _kill_after(run, n, mode, via):
            break
        read = _read(run)  # the newest step: 5, not 4
        old, new = _same(read, STEP), _same(read, STEP + 1000)
        assert old or new, f"rename {n}: step 5 holds neither the old nor the new state"
        seen.append("old" if old else "new")
        assert_state_equal(_read(run, step=STEP), read)
        assert_state_equal(_read(run / ENTRY), read)  # by the step's own path too
        data, table = _ls(run)
        rows = {c["step"]: c for c in data["checkpoints"]}
        assert sorted(rows) == [4, STEP] and rows[STEP]["error"] is None, data
        committed_name = Path(rows[STEP]["path"]).name
        assert committed_name not in {p["name"] for p in data["partial"]}, data
        if committed_name != ENTRY:  # named for what it is, never "partial"
            assert ".replaced-" in committed_name
            assert "the copy an interrupted overwrite set aside" in table
        live = state_for(0)
        with sk.Checkpointer(run) as ckpt:
            restored = ckpt.restore_latest(live, strict=sk.Strict.ALLOW_MISSING)
            assert restored == STEP, f"rename {n}"
        assert_state_equal(live, read)
        # the recovery kept the committed copy, under its own name, and left nothing else
        names = sorted(p.name for p in run.iterdir() if p.is_dir())
        assert names == ["step_000000004", ENTRY], names
        assert_state_equal(_read(run), read)
        # and the step can be saved again
        sk.save(run, state_for(STEP + 2000), step=STEP, overwrite=True, shard_bytes=100_000)
        assert _same(_read(run), STEP + 2000)
    renames = n - 1
    assert renames >= (2 if mode == "exchange" else 3), seen
    if mode == "fallback":  # killed between the renames: the set-aside copy is committed
        assert seen[0] == "old", seen
    assert seen[-1] == "new", seen


def test_load_and_listing_take_a_set_aside_copy_as_the_committed_step(tmp_path: Path) -> None:
    """What a kill between the two renames of the fallback protocol leaves, made by hand:
    step 5 only as ``step_000000005.replaced-<id>`` (and the new copy as a partial)."""
    sk.save(tmp_path, state_for(4), step=4)
    sk.save(tmp_path, state_for(STEP), step=STEP)
    (tmp_path / ENTRY).rename(tmp_path / f"{ENTRY}.replaced-00ff00ff00ff")
    assert [i.step for i in sk.list_checkpoints(tmp_path)] == [4, STEP]
    assert sk.audit.list_partial(tmp_path) == []
    assert _same(sk.read(tmp_path), STEP)
    with pytest.raises(sk.errors.StepExistsError):
        sk.save(tmp_path, state_for(STEP), step=STEP)  # it is committed
    assert sk.audit.remove_partial(tmp_path) == []
    assert (tmp_path / ENTRY).is_dir()  # put back under its own name
    assert _same(sk.read(tmp_path), STEP)
