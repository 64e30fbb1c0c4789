"""A ``checkpoint-N`` the Trainer route saves again, on a file system without
``RENAME_EXCHANGE`` (NFS, some FUSE file systems): the old folder is renamed aside, then the
new one in. A kill between the two renames leaves ``checkpoint-N`` only as its set-aside
copy; the next save's clean-up must put that copy back, never delete it with the partial."""

from __future__ import annotations

from pathlib import Path

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
