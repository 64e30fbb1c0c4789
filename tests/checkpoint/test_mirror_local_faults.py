"""A mirror on another local disk that fails as a disk does (a raw OSError, not a store's
StorageError): the resume behaves as with an unreachable object store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import statekeeper as sk


def _broken_mirror(tmp_path: Path, *, local_steps: bool) -> tuple[sk.Checkpointer, Path]:
    run, mirror = tmp_path / "run", tmp_path / "mirror"
    with sk.Checkpointer(run, mirror=sk.Mirror(mirror)) as ckpt:
        ckpt.save(1, {"w": torch.ones(3)})
    if not local_steps:
        shutil.rmtree(run)
    ckpt = sk.Checkpointer(run, mirror=sk.Mirror(mirror, retries=0, backoff=0.0))
    shutil.rmtree(mirror)
    mirror.write_text("the mount went away")  # listing it now raises NotADirectoryError
    return ckpt, mirror


def test_an_unlistable_local_mirror_does_not_stop_a_resume_with_local_steps(
    tmp_path: Path,
) -> None:
    ckpt, _ = _broken_mirror(tmp_path, local_steps=True)
    state = {"w": torch.zeros(3)}
    try:
        with pytest.warns(sk.StatekeeperWarning, match="cannot list the mirror"):
            step = ckpt.restore_latest(state)
        assert step == 1 and torch.equal(state["w"], torch.ones(3))
    finally:
        ckpt.close()


def test_an_unlistable_local_mirror_and_no_local_step_is_a_mirror_error(tmp_path: Path) -> None:
    ckpt, _ = _broken_mirror(tmp_path, local_steps=False)
    try:
        with pytest.raises(sk.errors.MirrorError, match="cannot list the mirror"):
            ckpt.restore_latest({"w": torch.zeros(3)})
    finally:
        ckpt.close()
