"""Accelerate saving through statekeeper: a run killed mid-way and resumed through
``load_state`` ends bitwise identical to a run that never stopped, within an epoch and at
an epoch's end."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.helpers.framework_runs import run_to_end

import statekeeper as sk


def _run(where: Path, out: Path, every: int, kill: int, *more: str) -> int:
    return run_to_end("accelerate_run", where, out, every, kill, *more)


def _same(a_file: Path, b_file: Path, first: int) -> None:
    """The resumed run (from step ``first`` on) ends as the straight one, every step's
    inputs (augmented in the workers) included."""
    a, b = load_file(str(a_file)), load_file(str(b_file))
    assert b["trained"].tolist() == list(range(first, 21))  # from the newest step on
    assert sorted(k for k in b if k.startswith("input/")) == sorted(
        f"input/{s}" for s in range(first, 21)
    )
    assert b.keys() <= a.keys() and any(k.startswith("adam/") for k in b)
    for key in b.keys() - {"trained"}:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(
    ("every", "kill", "kept", "more"),
    [
        (3, 13, [9, 12], ()),  # resumed mid-epoch 1
        (4, 17, [12, 16], ()),  # at epoch 1's end
        (3, 13, [9, 12], ("augment",)),  # mid-epoch, random augmentation in 2 workers
        (4, 17, [12, 16], ("augment",)),
        (4, 17, [12, 16], ("augment", "persistent")),  # workers kept over the epoch's end
    ],
)
def test_a_killed_accelerate_run_resumes_bitwise(
    tmp_path: Path, every: int, kill: int, kept: list[int], more: tuple[str, ...]
) -> None:
    assert _run(tmp_path / "straight", tmp_path / "straight.st", every, 0, *more) == 0
    project = tmp_path / "killed"
    assert _run(project, tmp_path / "unused.st", every, kill, *more) == -9  # SIGKILL
    run = project / "checkpoints"
    assert [i.step for i in sk.list_checkpoints(run)] == kept  # total_limit=2
    assert _run(project, tmp_path / "resumed.st", every, 0, "resume", *more) == 0
    _same(tmp_path / "straight.st", tmp_path / "resumed.st", kept[-1] + 1)
    assert sk.audit.verify(run).ok  # what the framework saved is an ordinary statekeeper run


def test_the_default_loaders_and_plain_shuffling_are_handled(tmp_path: Path) -> None:
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader, TensorDataset

    from statekeeper.integrations.accelerate import load_state, save_state

    data = TensorDataset(torch.randn(16, 2))
    plain = Accelerator(cpu=True)  # loaders keep no position: saved without them
    model = plain.prepare(torch.nn.Linear(2, 2))
    plain.prepare(DataLoader(data, batch_size=4, shuffle=True))
    save_state(plain, tmp_path / "a", step=5)
    assert load_state(plain, tmp_path / "a").step == 5
    assert "dataloader" not in sk.read(tmp_path / "a") and model is not None
    stateful = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
    )
    stateful.prepare(DataLoader(data, batch_size=4, shuffle=True))
    with pytest.raises(sk.errors.InvalidArgumentError, match="use_seedable_sampler=True"):
        save_state(stateful, tmp_path / "b", step=1)


def test_has_checkpoint_says_whether_there_is_anything_to_resume(tmp_path: Path) -> None:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from statekeeper.integrations.accelerate import has_checkpoint, load_state, save_state

    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    accelerator.prepare(torch.nn.Linear(2, 2))
    assert not has_checkpoint(accelerator)  # a first run: nothing, not even the directory
    with pytest.raises(FileNotFoundError):
        load_state(accelerator)
    (tmp_path / "checkpoints").mkdir()
    assert not has_checkpoint(accelerator)  # an empty run directory
    save_state(accelerator, step=3)
    assert has_checkpoint(accelerator) and load_state(accelerator).step == 3
    assert not has_checkpoint(accelerator, tmp_path / "elsewhere")


@pytest.mark.xdist_group("gloo")
def test_a_killed_two_process_job_resumes_each_rank_from_its_own_state(tmp_path: Path) -> None:
    """Two processes (gloo), random augmentation in two workers per rank: each rank's
    loader position, worker RNG and process RNG are its own, saved and restored per rank
    (rank 1 restored from rank 0's state would augment and drop out as rank 0 does)."""
    import sys

    from tests.helpers import launcher

    def job(where: Path, out: Path, kill: int, *more: str) -> int:
        args = [sys.executable, "-m", "tests.helpers.accelerate_ddp", str(where), str(out)]
        done = launcher.run(
            [*args, "3", str(kill), *more, "augment"], cwd=launcher.ROOT, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode in (0, 9), done.stderr[-3000:]
        return done.returncode

    assert job(tmp_path / "straight", tmp_path / "straight.st", 0) == 0
    project = tmp_path / "killed"
    assert job(project, tmp_path / "unused.st", 16) == 9  # 4 batches a rank an epoch
    assert [i.step for i in sk.list_checkpoints(project / "checkpoints")] == [12, 15]
    assert job(project, tmp_path / "resumed.st", 0, "resume") == 0  # from mid-epoch 3
    for rank in ("", ".rank1"):
        _same(tmp_path / f"straight.st{rank}", tmp_path / f"resumed.st{rank}", 16)


def test_the_accelerate_example_of_the_docs_resumes_bitwise_after_a_kill(tmp_path: Path) -> None:
    """The user-level example of docs/integrations.md, run to its end; run again, SIGKILLed
    right after its step 10 is committed, then run once more: the same final weights."""
    from tests.helpers.doc_examples import run_killed_and_resumed

    run_killed_and_resumed(tmp_path, "accelerate", 10)


def test_workers_started_before_statekeeper_saw_the_loader_warn_at_save(tmp_path: Path) -> None:
    from accelerate import Accelerator, DataLoaderConfiguration
    from tests.helpers.accelerate_run import Augmenting
    from torch.utils.data import DataLoader

    from statekeeper.integrations.accelerate import has_checkpoint, save_state

    config = DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=True)
    for seen_first in (False, True):
        accelerator = Accelerator(cpu=True, dataloader_config=config)
        loader = accelerator.prepare(DataLoader(Augmenting(), batch_size=4, num_workers=2))
        if seen_first:
            assert not has_checkpoint(accelerator, tmp_path / f"run{seen_first}")
        next(iter(loader))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            save_state(accelerator, tmp_path / f"run{seen_first}", step=1)
        said = [str(w.message) for w in caught if issubclass(w.category, sk.StatekeeperWarning)]
        assert bool(said) is not seen_first, said
        assert not said or "has_checkpoint(accelerator)" in said[0]


def test_a_step_total_limit_cannot_remove_fails_no_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention by ``total_limit`` runs after the step is committed: a step it cannot
    remove (a mount point: ``EBUSY``, injected for that one directory) is warned about and
    the save reports success, as the Checkpointer's retention does."""
    import errno
    import os

    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from statekeeper.integrations.accelerate import save_state

    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=1
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    accelerator.prepare(torch.nn.Linear(2, 2))
    run = tmp_path / "checkpoints"
    assert save_state(accelerator).step == 0
    busy, real_rename = str(run / "step_000000000"), os.rename

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if os.fspath(src) == busy:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), busy)
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.warns(sk.StatekeeperWarning, match="could not remove step 0.*Step 1 is saved"):
        assert save_state(accelerator).step == 1
    monkeypatch.undo()
    assert [i.step for i in sk.list_checkpoints(run)] == [0, 1]
    assert save_state(accelerator).step == 2  # removable again: retried, and gone
    assert [i.step for i in sk.list_checkpoints(run)] == [2]
