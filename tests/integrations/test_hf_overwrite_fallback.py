"""A ``checkpoint-N`` the Trainer route saves again, on a file system without
``RENAME_EXCHANGE`` (NFS, some FUSE file systems): the old folder is renamed aside, then the
new one in. A kill between the two renames leaves ``checkpoint-N`` only as its set-aside
copy; the next save's clean-up must put that copy back, never delete it with the partial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statekeeper.integrations import hf_layout


class _Killed(BaseException):
    """Stands for the SIGKILL right after the first rename (nothing after it runs)."""


def test_a_kill_between_the_fallback_renames_keeps_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    final = tmp_path / "checkpoint-5"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"old")
    built = hf_layout.staging(tmp_path, 5)
    built.mkdir()
    (built / "model.safetensors").write_bytes(b"new")
    monkeypatch.setattr(hf_layout, "exchange", lambda a, b: False)  # no RENAME_EXCHANGE here
    real_rename = Path.rename

    def rename_then_die(self: Path, target: str | Path) -> Path:
        moved = real_rename(self, target)
        if self == final:  # the old copy is set aside: the kill comes now
            raise _Killed
        return moved

    monkeypatch.setattr(Path, "rename", rename_then_die)
    with pytest.raises(_Killed):
        hf_layout.commit(built, 5)
    monkeypatch.undo()
    assert not final.exists()  # only the set-aside copy and the partial one are left
    hf_layout.remove_leftovers(tmp_path)  # what the restarted run's next save does first
    assert (final / "model.safetensors").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-5"]
    assert sorted(hf_layout.checkpoints(tmp_path)) == [5]


def test_a_folder_rotation_cannot_remove_fails_no_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``save_total_limit`` rotation runs after ``checkpoint-N`` is committed: a folder it
    cannot rename aside (a mount point: ``EBUSY``, injected for that one folder) is warned
    about and stays, the others go, and nothing is raised into the Trainer's save."""
    import errno

    import statekeeper as sk

    for step in (1, 2, 3):
        (tmp_path / f"checkpoint-{step}").mkdir()
    busy, real_rename = tmp_path / "checkpoint-1", Path.rename

    def rename(self: Path, target: str | Path) -> Path:
        if self == busy:
            raise OSError(errno.EBUSY, "Device or resource busy", str(self))
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.warns(sk.StatekeeperWarning, match=r"could not remove .*checkpoint-1.*busy"):
        assert hf_layout.rotate(tmp_path, sk.KeepLatest(1), [tmp_path / "checkpoint-3"]) == [2]
    monkeypatch.undo()
    assert sorted(hf_layout.checkpoints(tmp_path)) == [1, 3]
    assert hf_layout.rotate(tmp_path, sk.KeepLatest(1), [tmp_path / "checkpoint-3"]) == [1]


def _trainer(out: Path, max_steps: int) -> Any:
    from tests.helpers.hf_trainer_run import dataset, model
    from transformers import TrainingArguments

    from statekeeper.integrations.transformers import StatekeeperTrainer

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    return StatekeeperTrainer(model=model(), args=args, train_dataset=dataset())


def test_a_resume_after_a_kill_between_the_renames_continues_from_that_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run rolled back to checkpoint-2 saves checkpoint-4 again and is killed between the
    two renames (the on-disk state the SIGKILL leaves, made in this process: the first
    rename done, nothing after it runs): checkpoint-4 exists only as its set-aside copy,
    which transformers' ``get_last_checkpoint`` does not see. The next
    ``train(resume_from_checkpoint=True)`` must put it back first and resume from step 4,
    not from checkpoint-2."""
    _trainer(tmp_path, 4).train()
    old = (tmp_path / "checkpoint-4" / "model.safetensors").read_bytes()
    monkeypatch.setattr(hf_layout, "exchange", lambda a, b: False)  # no RENAME_EXCHANGE here
    final, real_rename = tmp_path / "checkpoint-4", Path.rename

    def rename_then_die(self: Path, target: str | Path) -> Path:
        moved = real_rename(self, target)
        if self == final:  # the old checkpoint-4 is set aside: the kill comes now
            raise _Killed
        return moved

    monkeypatch.setattr(Path, "rename", rename_then_die)
    with pytest.raises(_Killed):
        _trainer(tmp_path, 4).train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    monkeypatch.undo()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-"))
    assert names[:2] == ["checkpoint-2", "checkpoint-4.partial"], names
    assert len(names) == 3 and names[2].startswith("checkpoint-4.replaced-"), names
    assert not final.exists()

    resumed = _trainer(tmp_path, 6)
    loaded: list[str] = []
    load = resumed._load_from_checkpoint

    def spy(checkpoint: str, model: Any = None) -> None:
        loaded.append(Path(checkpoint).name)
        load(checkpoint, model)

    resumed._load_from_checkpoint = spy
    resumed.train(resume_from_checkpoint=True)
    assert loaded == ["checkpoint-4"]  # it resumed from checkpoint-2
    assert resumed.state.global_step == 6
    assert (final / "model.safetensors").read_bytes() == old  # the set-aside copy, put back
    assert not list(tmp_path.glob("abandoned.*"))
    assert sorted(hf_layout.checkpoints(tmp_path)) == [2, 4, 6]
