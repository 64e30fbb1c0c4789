"""Accelerate saving through statekeeper: a run killed mid-way and resumed through
``load_state`` ends bitwise identical to a run that never stopped, within an epoch and at
an epoch's end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.helpers.framework_runs import run_to_end

import statekeeper as sk


def _run(where: Path, out: Path, every: int, kill: int, *more: str) -> int:
    return run_to_end("accelerate_run", where, out, every, kill, *more)


@pytest.mark.parametrize(
    ("every", "kill", "kept"),
    [(3, 13, [9, 12]), (4, 17, [12, 16])],  # resumed mid-epoch 1, then at epoch 1's end
)
def test_a_killed_accelerate_run_resumes_bitwise(
    tmp_path: Path, every: int, kill: int, kept: list[int]
) -> None:
    assert _run(tmp_path / "straight", tmp_path / "straight.st", every, 0) == 0
    project = tmp_path / "killed"
    assert _run(project, tmp_path / "unused.st", every, kill) == -9  # SIGKILL after `kill`
    run = project / "checkpoints"
    assert [i.step for i in sk.list_checkpoints(run)] == kept  # total_limit=2
    assert _run(project, tmp_path / "resumed.st", every, 0, "resume") == 0
    a = load_file(str(tmp_path / "straight.st"))
    b = load_file(str(tmp_path / "resumed.st"))
    assert b["trained"].tolist() == list(range(kept[-1] + 1, 21))  # from the newest step on
    assert a.keys() == b.keys() and any(k.startswith("adam/") for k in a)
    for key in a.keys() - {"trained"}:
        assert torch.equal(a[key], b[key]), key
    assert sk.verify(run).ok  # what the framework saved is an ordinary statekeeper run


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
    with pytest.raises(sk.InvalidArgumentError, match="use_seedable_sampler=True"):
        save_state(stateful, tmp_path / "b", step=1)


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
