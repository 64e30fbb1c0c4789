"""Runs under pressure: deletions that are killed, readers racing retention, a full disk, and
paths that are not run directories."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import launcher
from tests.helpers.hostile import ENTRY, saved_run, small_state
from tests.helpers.saver import state_for

import statekeeper as sk
from statekeeper.checkpoint.points import KILL_AT
from statekeeper.format.safetensors_io import layout
from statekeeper.storage import local
from statekeeper.testing import assert_state_equal

ROOT = Path(__file__).resolve().parents[2]


def test_retention_unlists_a_step_before_deleting_any_of_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill in the middle of a deletion leaves a name no listing reads, then is cleaned."""
    run = saved_run(tmp_path, steps=(1,))
    sk.save(run, small_state(2), step=2, shard_bytes=64)  # several files to delete

    def killed_midway(path: Path, ignore_errors: bool = False) -> None:
        next(p for p in Path(path).iterdir() if p.name.endswith(".safetensors")).unlink()
        raise KeyboardInterrupt  # stands for the kill: the rest of the files stay

    # (typing) the module's own import, patched by the test
    monkeypatch.setattr(local.shutil, "rmtree", killed_midway)  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        sk.storage.LocalStorage(run).remove("step_000000002")
    monkeypatch.undo()
    assert [i.step for i in sk.list_checkpoints(run)] == [1]
    leftovers = [p.kind for p in sk.audit.list_partial(run)]
    assert leftovers == ["removing"]
    with sk.Checkpointer(run) as ckpt:  # resume cleans the leftover like a partial save
        live = small_state(0)
        assert ckpt.restore_latest({"model": live["model"]}, strict=sk.Strict.PARTIAL) == 1
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == [ENTRY]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("kill_at", "left"),
    [
        ("committed", [0, 1]),  # step 1 committed, retention not begun
        ("removing", [0, 1]),  # retention about to remove step 0
        ("begun:2", [1]),  # step 0 removed, step 2 begun
        ("removing:2", [1, 2]),  # step 2 committed, retention about to remove step 1
    ],
)
def test_sigkill_during_retention_never_leaves_a_listed_step_that_fails(
    tmp_path: Path, kill_at: str, left: list[int], mode: str
) -> None:
    """A Checkpointer keeping one step (asynchronous or blocking) saves steps 1 and 2 over a
    saved step 0 and is SIGKILLed at a named point of its saves and deletions
    (statekeeper/checkpoint/points.py): every listed step loads as saved (2 of 10 async runs
    left a listed, half-deleted step before deletions were made atomic)."""
    sk.save(tmp_path, state_for(0), step=0, shard_bytes=100_000)
    child = launcher.Popen(  # forked with torch imported: a process of its own all the same
        [sys.executable, "-m", "tests.helpers.saver", str(tmp_path), "1", mode, "keep", "2"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, KILL_AT: kill_at},
    )  # fmt: skip
    out, _ = child.communicate()
    assert child.returncode == -9, f"not killed at {kill_at}: {out!r}"
    infos = sk.list_checkpoints(tmp_path)
    assert [i.step for i in infos] == left
    for info in infos:
        assert info.error is None, f"{kill_at}: {info.error}"
        saved = dict(sk.read(tmp_path, step=info.step))
        saved.pop("rng", None)
        assert_state_equal(saved, state_for(info.step))
    sk.audit.remove_partial(tmp_path)
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1)) as ckpt:  # the run goes on
        ckpt.save(3, state_for(3))
    assert [i.step for i in sk.list_checkpoints(tmp_path)] == [3]


class _RetentionRacer(sk.storage.LocalStorage):
    """Deletes the step the moment a reader opens one of its files, as a writer's retention
    would in another process."""

    def __init__(self, root: Path, victim: str, file: str) -> None:
        super().__init__(root)
        self.victim, self.file = victim, file

    def read(self, entry: str, name: str) -> Any:
        if entry == self.victim and name == self.file:
            self.remove(entry)
        return super().read(entry, name)


@pytest.mark.parametrize("file", ["manifest.json", "tensors-00000.safetensors"])
def test_a_step_deleted_while_it_is_read_is_gone_not_damaged(tmp_path: Path, file: str) -> None:
    run = tmp_path
    with sk.Checkpointer(run) as ckpt:
        for step in (1, 2):
            ckpt.save(step, small_state(step))
    racer = _RetentionRacer(run, "step_000000002", file)
    live = small_state(5)
    with pytest.raises(sk.StepNotFoundError, match="was deleted while it was being read"):
        sk.load(racer, live, step=2)
    racer = _RetentionRacer(run, "step_000000001", file)
    with pytest.raises(sk.StepNotFoundError, match="step_000000001 was deleted while"):
        sk.read(racer, step=1)


def test_restore_latest_moves_past_a_step_deleted_while_it_is_read(tmp_path: Path) -> None:
    run = tmp_path
    with sk.Checkpointer(run) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, small_state(step))
    expected = small_state(2)["model"].state_dict()
    live = small_state(9)
    racer = _RetentionRacer(run, "step_000000003", "manifest.json")
    with (
        pytest.warns(sk.StatekeeperWarning, match="skipping deleted step 3"),
        sk.Checkpointer(racer) as ckpt,
    ):
        assert ckpt.restore_latest({"model": live["model"], "epoch": 0}) == 2
    assert_state_equal(live["model"].state_dict(), expected)


def test_a_listing_leaves_out_a_step_deleted_meanwhile(tmp_path: Path) -> None:
    run = saved_run(tmp_path, steps=(1, 2))
    racer = _RetentionRacer(run, "step_000000002", "manifest.json")
    assert [(i.step, i.error) for i in sk.list_checkpoints(racer)] == [(1, None)]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a real file system that really runs out of space (needs root, as CI
    and the developers' machines run)."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"could not mount a small tmpfs: {done.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _big(seed: int) -> dict[str, Any]:
    return {"w": torch.full((1024, 1024), float(seed))}  # 4 MiB: more than the disk holds


@pytest.mark.parametrize("how", ["save", "checkpointer", "async"])
def test_a_full_disk_is_a_storage_error_naming_run_step_file_and_bytes(
    small_disk: Path, how: str
) -> None:
    run = small_disk / "run"
    sk.save(run, {"w": torch.ones(16)}, step=1)

    def save() -> None:
        if how == "save":
            sk.save(run, _big(2), step=2)
            return
        with sk.Checkpointer(run, blocking=how != "async") as ckpt:
            ckpt.save(2, _big(2))

    with pytest.raises(sk.errors.StorageError) as caught:
        save()
    exc = caught.value
    assert isinstance(exc, OSError) and exc.errno == errno.ENOSPC
    text = str(exc)
    assert f"saving step 2 into {run} failed" in text
    assert "tensors-00000.safetensors" in text and "step_000000002.partial-" in text
    claimed = int(re.search(r"The step needs (\d+) bytes for its tensor files", text)[1])
    needed = layout({"w": _big(2)["w"]}).size  # the checkpointers add the RNG states
    assert claimed == needed if how == "save" else needed < claimed < needed + (1 << 20)
    assert "free space" in text
    assert [i.step for i in sk.list_checkpoints(run)] == [1]
    assert sk.audit.list_partial(run) == []
    assert torch.equal(sk.read(run)["w"], torch.ones(16))


def test_load_of_a_file_or_a_missing_path_says_so(tmp_path: Path) -> None:
    file = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, file)
    for call in (lambda: sk.load(file, {"w": torch.zeros(2)}), lambda: sk.Checkpointer(file)):
        with pytest.raises(sk.StepNotFoundError, match="is a file, not a statekeeper run"):
            call()
    missing = tmp_path / "nope"
    with pytest.raises(sk.StepNotFoundError, match="does not exist"):
        sk.load(missing, {"w": torch.zeros(2)})
    with pytest.raises(sk.StepNotFoundError, match="does not exist"):
        sk.read(missing)
    assert not missing.exists()  # looking did not create it


def test_removing_a_step_twice_or_a_partial_is_quiet(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    storage = sk.storage.LocalStorage(run)
    storage.remove(ENTRY)
    storage.remove(ENTRY)
    (run / "step_000000002.partial-abc").mkdir()
    storage.remove("step_000000002.partial-abc")
    assert [p.name for p in run.iterdir()] == [".statekeeper.lock"] or list(run.iterdir()) == []


def test_rmtree_is_not_used_on_a_committed_name(tmp_path: Path) -> None:
    """The committed name is never passed to rmtree: it is renamed first."""
    run = saved_run(tmp_path)
    seen: list[str] = []
    real = shutil.rmtree

    def spy(path: Any, ignore_errors: bool = False) -> None:
        seen.append(Path(path).name)
        real(path, ignore_errors=ignore_errors)

    # (typing) the module's own import, patched by the test
    local.shutil.rmtree = spy  # type: ignore[attr-defined]
    try:
        sk.storage.LocalStorage(run).remove(ENTRY)
    finally:
        # (typing) the module's own import, patched by the test
        local.shutil.rmtree = real  # type: ignore[attr-defined]
    assert len(seen) == 1 and seen[0].startswith(f"{ENTRY}.removing-")
