"""A reader racing the writer's recovery finds the step under its new name.

After an overwrite was killed between its two renames (a file system without
``RENAME_EXCHANGE``), the committed copy of step 5 is ``step_000000005.replaced-<id>``; the
writer's next ``restore_latest`` / clean-up renames it back to ``step_000000005``
(``storage.commit.recover``). A reader in another process that opened the step under its
set-aside name then finds its files gone. That rename is placed here deterministically, in
the same process: the reader's own storage calls ``recover`` (the writer's real code) at the
exact point, just before it opens the step's first tensor file (``load``) or its manifest
(``list_checkpoints``), so that the reader's open meets ``ENOENT`` as it would in the other
process. The reader must locate step 5 again by its number and read it, never report it
"deleted while it was being read" or leave it out of the listing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import statekeeper as sk
from statekeeper.storage import commit
from statekeeper.storage.local import LocalStorage

ENTRY = "step_000000005"


@pytest.fixture
def set_aside_run(tmp_path: Path) -> Path:
    """A run whose step 5 an overwrite killed between its renames left set aside (the exact
    on-disk state: the old copy renamed to ``.replaced-<id>``, the new one still partial)."""
    run = tmp_path / "run"
    sk.save(run, {"w": torch.arange(6.0)}, step=5)
    os.rename(run / ENTRY, run / f"{ENTRY}{commit.REPLACED}0123456789ab")
    (run / f"{ENTRY}{commit.PARTIAL}ba9876543210").mkdir()
    return run


def _recover_before_first(monkeypatch: pytest.MonkeyPatch, run: Path, wanted: str) -> list[str]:
    """Make ``LocalStorage.size`` run the writer's recovery of ``run`` right before the
    first time it is asked for a file whose name ends with ``wanted``; what it restored."""
    original = LocalStorage.size
    restored: list[str] = []

    def size(self: LocalStorage, entry: str, name: str) -> int:
        if name.endswith(wanted) and not restored:
            restored.extend(commit.recover(run))  # the rename, at this exact point
        return original(self, entry, name)

    monkeypatch.setattr(LocalStorage, "size", size)
    return restored


def test_a_load_that_meets_the_recovery_rename_reads_the_step(
    set_aside_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restored = _recover_before_first(monkeypatch, set_aside_run, ".safetensors")
    state = {"w": torch.zeros(6)}
    sk.load(set_aside_run, state)  # it raised StepNotFoundError "deleted while ... read"
    assert restored == [ENTRY]
    assert torch.equal(state["w"], torch.arange(6.0))


def test_a_listing_that_meets_the_recovery_rename_keeps_the_step(
    set_aside_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restored = _recover_before_first(monkeypatch, set_aside_run, "manifest.json")
    infos = sk.list_checkpoints(set_aside_run)  # step 5 was left out
    assert restored == [ENTRY]
    assert [(i.step, i.error) for i in infos] == [(5, None)]
    assert infos[0].path == str(set_aside_run / ENTRY)
