"""Lightning runs bounded by ``max_epochs``, killed (SIGKILL) and resumed with
``ckpt_path="last"``: every step trains on the samples, augmentations (drawn in two loader
workers from torch's, numpy's and Python's RNGs) and random draws of the run that never
stopped, and the model ends bitwise identical (tests/helpers/lightning_exact_run.py). Each
test runs under both Lightning packages (``lightning``: tests/integrations/conftest.py); the
straight reference is pytorch_lightning's, so the unified package must match it bitwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tests.helpers.framework_runs import run_to_end
from tests.helpers.launcher import ROOT

import statekeeper as sk

Log = dict[tuple[int, bool], list[Any]]


def _job(where: Path, log: Path, saves: int, kill: int, devices: int, *more: str) -> int:
    if devices == 1:
        return run_to_end("lightning_exact_run", where, log, saves, kill, "1", *more)
    args = [sys.executable, "-m", "tests.helpers.lightning_exact_run", str(where), str(log)]
    done = subprocess.run(
        [*args, str(saves), str(kill), str(devices), *more],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode in (0, -9), done.stderr[-3000:]
    return done.returncode


def _log(log: Path, rank: int) -> Log:
    """(step, final) -> what that step trained on (the last run's, where a resume ran it
    again), and the final parameters."""
    seen: Log = {}
    for line in (log.parent / f"{log.name}.{rank}").read_text().splitlines():
        row = json.loads(line)
        seen[(row[0], row[1] == "final")] = row[1:]
    return seen


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted run (saving at the end of every epoch), the reference of every
    kill: saving never changes training, so runs saving at other steps must match it."""
    where = tmp_path_factory.mktemp("straight")
    assert _job(where / "run", where / "log", 0, 0, 1) == 0
    return where / "log"


def _killed_and_resumed(tmp_path: Path, saves: int, kill: int, newest: int) -> Log:
    where, log = tmp_path / "run", tmp_path / "log"
    assert _job(where, log, saves, kill, 1) == -9
    assert [i.step for i in sk.list_checkpoints(where / "last.ckpt")] == [newest]
    assert _job(where, log, saves, 0, 1, "resume") == 0
    return _log(log, 0)


def test_resumed_from_an_epochs_last_batch_trains_the_remaining_epochs(
    tmp_path: Path, straight: Path, lightning: ModuleType
) -> None:
    """Saved by epoch 0's last batch (step 6 of 18): Lightning alone counts the resumed
    run an epoch further on and stops at step 12 ("max_epochs reached")."""
    resumed = _killed_and_resumed(tmp_path, 6, 7, 6)
    expected = _log(straight, 0)
    assert sorted(k for k in resumed if not k[1]) == list((s, False) for s in range(18))
    assert resumed == expected


def test_resumed_from_an_epoch_end_save_draws_the_next_epochs_order(
    tmp_path: Path, straight: Path, lightning: ModuleType
) -> None:
    """ModelCheckpoint's default save, as epoch 0 ends: Lightning alone does not load the
    loader's position, and every resumed epoch replays epoch 0's shuffle order."""
    resumed = _killed_and_resumed(tmp_path, 0, 7, 6)
    expected = _log(straight, 0)
    assert expected[(6, False)][0] != expected[(0, False)][0]  # epochs are shuffled apart
    assert resumed == expected


def test_a_plain_augmenting_dataset_in_workers_is_warned_about_and_the_fix_is_exact(
    tmp_path: Path, straight: Path, lightning: ModuleType
) -> None:
    """Mid-epoch (newest step 9, epoch 1): the user's plain dataset gets a warning at fit
    start naming WorkerRNGDataset; with it, every augmentation drawn in the two workers
    after the resume is the straight run's."""
    where, log = tmp_path / "run", tmp_path / "log"
    assert _job(where, log, 3, 10, 1, "wrapped") == -9
    assert _job(where, log, 3, 0, 1, "resume", "wrapped") == 0
    assert _log(log, 0) == _log(straight, 0)


@pytest.mark.xdist_group("gloo")
def test_a_ddp_run_resumes_each_ranks_own_loader_worker_rng_and_rng(
    tmp_path: Path, lightning: ModuleType
) -> None:
    """Two gloo ranks that draw apart (their own seeds, their own workers' augmentations),
    with StatefulDistributedSampler and WorkerRNGDataset, killed mid-epoch 1 and resumed:
    each rank resumes its own state (Lightning keeps rank 0's checkpoint alone; before,
    rank 1 resumed rank 0's RNG and workers' RNG)."""
    straight, where, log = tmp_path / "straight", tmp_path / "run", tmp_path / "log"
    assert _job(tmp_path / "s", straight, 3, 0, 2, "wrapped") == 0
    assert _job(where, log, 3, 10, 2, "wrapped") == -9
    assert len(sk.read(where / "last.ckpt")["statekeeper_ranks"]) == 2
    assert _job(where, log, 3, 0, 2, "resume", "wrapped") == 0
    for rank in (0, 1):
        assert _log(log, rank) == _log(straight, rank), rank
    assert _log(straight, 0)[(0, False)] != _log(straight, 1)[(0, False)]
