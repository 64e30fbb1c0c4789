"""``save(..., blocking=False)`` returns a ``PendingSave`` its caller owns: nothing else in
the process remembers it, a second save into the directory while it runs is refused by
name, and one dropped without a look is loud."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import statekeeper as sk
from statekeeper import lanes
from statekeeper.checkpoint.pending import PendingSave
from statekeeper.storage.memory import MemoryStorage


class Gated(MemoryStorage):
    """A memory storage whose writes begin only once ``gate`` is set (the save is then
    certainly in flight while the test acts)."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.gate = threading.Event()

    def begin(self, entry: str, *, replace: bool = False) -> Any:
        if not self.gate.wait(timeout=120):  # a hang guard only
            raise TimeoutError("the test never opened the gate")
        return super().begin(entry, replace=replace)


def _settled() -> None:
    """Every one-off background save handed out so far has ended (its PendingSave may be
    dropped: the tests of what a dropped one says need it ended, not waited)."""
    lanes.drain("save")


@pytest.fixture
def gated(request: pytest.FixtureRequest) -> Iterator[Gated]:
    storage = Gated(f"memory://pending-{request.node.name}")
    yield storage
    storage.gate.set()


def test_a_pending_save_is_a_context_manager_that_waits(tmp_path: Any) -> None:
    with sk.save(tmp_path, {"x": torch.ones(3)}, step=1, blocking=False) as pending:
        assert pending.step == 1
    assert pending.done() and pending.error is None
    assert pending.result.step == 1
    assert [c.step for c in sk.list_checkpoints(tmp_path)] == [1]


def test_a_second_save_into_the_directory_while_one_runs_is_refused(gated: Gated) -> None:
    first = sk.save(gated, {"x": torch.ones(3)}, step=1, blocking=False)
    assert not first.done()
    with pytest.raises(sk.errors.WriterConflictError, match="being written"):
        sk.save(gated, {"x": torch.ones(3)}, step=2, blocking=False)
    gated.gate.set()
    assert first.wait().step == 1
    _settled()
    sk.save(gated, {"x": torch.ones(3)}, step=2, blocking=False).wait()  # its turn now
    assert [c.step for c in sk.list_checkpoints(gated)] == [1, 2]


class GatedLocal(sk.storage.LocalStorage):
    """A local run directory whose writes begin only once ``gate`` is set."""

    def __init__(self, root: Any) -> None:
        super().__init__(root)
        self.gate = threading.Event()

    def begin(self, entry: str, *, replace: bool = False) -> Any:
        if not self.gate.wait(timeout=120):  # a hang guard only
            raise TimeoutError("the test never opened the gate")
        return super().begin(entry, replace=replace)


class GatedFsspec(sk.storage.FsspecStorage):
    """An fsspec run whose writes begin only once ``gate`` is set."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.gate = threading.Event()

    def begin(self, entry: str, *, replace: bool = False) -> Any:
        if not self.gate.wait(timeout=120):  # a hang guard only
            raise TimeoutError("the test never opened the gate")
        return super().begin(entry, replace=replace)


def test_one_fsspec_storage_object_takes_one_save_at_a_time(
    request: pytest.FixtureRequest,
) -> None:
    """An object store's lock excludes no other process, but one FsspecStorage object
    runs one sk.save at a time: a clean-up beside it would delete the files it is writing
    (the step then committed without them)."""
    storage = GatedFsspec(f"memory://gated-{request.node.name}")
    first = sk.save(storage, {"x": torch.ones(3)}, step=1, blocking=False)
    try:
        for attempt in (
            lambda: sk.save(storage, {"x": torch.ones(3)}, step=2, blocking=False),
            lambda: sk.audit.remove_partial(storage),
        ):
            with pytest.raises(sk.errors.WriterConflictError, match="same storage object"):
                attempt()
    finally:
        storage.gate.set()
    assert first.wait().step == 1
    assert sk.audit.verify(storage).ok
    assert sk.audit.remove_partial(storage) == []  # its turn now


def test_a_checkpointers_own_storage_object_is_not_cleaned_up_beside_it(tmp_path: Any) -> None:
    """remove_partial through the storage object an open Checkpointer holds is refused (its
    background save's partial entry would go); the Checkpointer cleans up in restore_latest."""
    storage = sk.storage.LocalStorage(tmp_path)
    with sk.Checkpointer(storage, blocking=False) as ckpt:
        ckpt.save(1, {"x": torch.ones(3)})
        with pytest.raises(sk.errors.WriterConflictError, match="same storage object"):
            sk.audit.remove_partial(storage)
        assert ckpt.restore_latest({"x": torch.zeros(3)}) == 1
    assert sk.audit.remove_partial(storage) == []


def test_one_local_storage_object_takes_one_save_at_a_time(tmp_path: Any) -> None:
    """The local writer lock is re-entrant for its object (a Checkpointer's clean-up runs
    under the lock it holds), but a save through ``sk.save`` takes it for itself alone: a
    second save through the same object, a clean-up that would delete the running save's
    partial entry, and a Checkpointer on the object are refused while it runs."""
    storage = GatedLocal(tmp_path)
    first = sk.save(storage, {"x": torch.ones(3)}, step=1, blocking=False)
    try:
        for attempt in (
            lambda: sk.save(storage, {"x": torch.ones(3)}, step=2, blocking=False),
            lambda: sk.save(storage, {"x": torch.ones(3)}, step=2),
            lambda: sk.audit.remove_partial(storage),
            lambda: sk.Checkpointer(storage),
        ):
            with pytest.raises(sk.errors.WriterConflictError, match="same storage object"):
                attempt()
    finally:
        storage.gate.set()
    assert first.wait().step == 1
    sk.save(storage, {"x": torch.ones(3)}, step=2)  # its turn now
    with sk.Checkpointer(storage) as ckpt:
        with pytest.raises(sk.errors.WriterConflictError, match="same storage object"):
            sk.save(storage, {"x": torch.ones(3)}, step=3)  # not a second writer beside it
        ckpt.save(3, {"x": torch.ones(3)})
    assert [c.step for c in sk.list_checkpoints(tmp_path)] == [1, 2, 3]


def test_a_save_dropped_while_it_runs_warns_naming_its_step_and_still_commits(
    gated: Gated,
) -> None:
    pending = sk.save(gated, {"x": torch.ones(3)}, step=7, blocking=False)
    with pytest.warns(sk.StatekeeperWarning, match="step 7 .*dropped before it was waited"):
        del pending
    gated.gate.set()
    _settled()
    assert [c.step for c in sk.list_checkpoints(gated)] == [7]


def test_a_dropped_save_that_then_fails_warns_with_its_error(gated: Gated) -> None:
    gated.fail_at = gated.operations + 3
    pending = sk.save(gated, {"x": torch.ones(3)}, step=4, blocking=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del pending
        gated.gate.set()
        _settled()  # the failure is given by the writing thread
    texts = [str(w.message) for w in caught if issubclass(w.category, sk.StatekeeperWarning)]
    assert any("step 4" in t and "dropped" in t for t in texts)
    assert any("step 4" in t and "InjectedFailure" in t for t in texts)
    assert sk.list_checkpoints(gated) == []


def _failed(name: str) -> tuple[MemoryStorage, PendingSave]:
    """A one-off save of step 1 that failed, its thread ended (nobody looked yet)."""
    storage = MemoryStorage(name=f"memory://pending-{name}")
    storage.fail_at = storage.operations + 3
    pending = sk.save(storage, {"x": torch.ones(3)}, step=1, blocking=False)
    _settled()
    return storage, pending


def test_a_failed_save_dropped_unwaited_warns_and_the_next_save_goes_on() -> None:
    storage, pending = _failed("failed")
    assert pending.done()
    with pytest.warns(sk.StatekeeperWarning, match="step 1 .*failed.*InjectedFailure"):
        del pending
    sk.save(storage, {"x": torch.ones(3)}, step=2, blocking=False).wait()  # not raised again
    assert [c.step for c in sk.list_checkpoints(storage)] == [2]


def test_a_failure_looked_at_through_error_is_not_warned_again() -> None:
    _, pending = _failed("error")
    assert isinstance(pending.error, sk.storage.InjectedFailure)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sk.StatekeeperWarning)
        del pending


def test_a_checkpointers_pending_saves_belong_to_it(tmp_path: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", sk.StatekeeperWarning)
        with sk.Checkpointer(tmp_path, blocking=False) as ckpt:
            for step in (1, 2, 3):
                ckpt.save(step, {"x": torch.full((4,), float(step))})  # dropped: its own
            info = ckpt.wait()
    assert info is not None and info.step == 3
    assert [c.step for c in sk.list_checkpoints(tmp_path)] == [1, 2, 3]
