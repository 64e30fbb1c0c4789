"""Pickle-based files never run code: refused files name the globals they ask for."""

from __future__ import annotations

import os
import pickle
import pickletools
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.interop import formats

import statekeeper as sk
from statekeeper.interop.dcp import read_dcp_metadata
from statekeeper.interop.opcodes import DisallowedGlobal, restricted_load, scan_globals


class CreatesFile:
    """Unpickling this (with plain pickle) would create ``target``."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.target), "w"))


class RunsCommand:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.target}",))


@pytest.mark.parametrize("legacy", [False, True])
def test_malicious_torch_save_is_refused_and_never_runs(tmp_path: Path, legacy: bool) -> None:
    target = tmp_path / "created-by-unpickling"
    state = {"weight": torch.ones(2), "payload": CreatesFile(target)}
    path = formats.torch_file(tmp_path / "evil.pt", state, legacy=legacy)
    with pytest.raises(sk.errors.UnsafePickleError) as info:
        sk.read(path)
    assert not target.exists()
    assert info.value.globals == ("io.open",)
    message = str(info.value)
    assert str(path) in message and "io.open" in message
    assert "Nothing from it was executed" in message
    assert isinstance(info.value, ValueError)


def test_protocol_5_pickle_with_os_system_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "touched"
    path = tmp_path / "evil.bin"
    path.write_bytes(pickle.dumps({"x": RunsCommand(target)}, protocol=5))
    with pytest.raises(sk.errors.UnsafePickleError, match=r"posix\.system|os\.system") as info:
        sk.read(path)
    assert not target.exists()
    assert len(info.value.globals) == 1


class Config:
    """A config object, as ``save_hyperparameters()`` stores it in a Lightning checkpoint."""

    lr = 0.1


def test_lightning_hyperparameters_objects_are_refused(tmp_path: Path) -> None:
    path = formats.torch_file(
        tmp_path / "hp.ckpt", {"state_dict": {"w": torch.ones(1)}, "hyper_parameters": Config()}
    )
    with pytest.raises(sk.errors.UnsafePickleError, match=r"test_pickle_safety\.Config"):
        sk.read(path)


def test_accelerate_custom_object_is_refused(
    tmp_path: Path, accelerate: tuple[Path, dict[str, Any]]
) -> None:
    folder = tmp_path / "acc"
    folder.mkdir()
    for file in accelerate[0].iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    target = tmp_path / "created"
    torch.save({"obj": CreatesFile(target)}, folder / "custom_checkpoint_0.pkl")
    with pytest.raises(sk.errors.UnsafePickleError, match=r"custom_checkpoint_0\.pkl"):
        sk.read(folder)
    assert not target.exists()


@pytest.mark.parametrize("legacy", [False, True])
def test_truncated_pt_is_a_clear_corruption_error(tmp_path: Path, legacy: bool) -> None:
    whole = formats.torch_file(tmp_path / "whole.pt", formats.weights(), legacy=legacy)
    data = whole.read_bytes()
    for cut in (len(data) // 2, len(data) - 10):
        path = tmp_path / f"cut-{cut}.pt"
        path.write_bytes(data[:cut])
        with pytest.raises(sk.CorruptCheckpointError, match="truncated or damaged") as info:
            sk.read(path)
        assert info.value.path == str(path)


def test_dcp_metadata_with_a_planted_global_is_refused(tmp_path: Path) -> None:
    folder = formats.dcp_folder(tmp_path / "dcp", {"w": torch.ones(2)})
    target = tmp_path / "touched"
    (folder / ".metadata").write_bytes(pickle.dumps(RunsCommand(target), protocol=4))
    with pytest.raises(sk.errors.UnsafePickleError, match=r"\.metadata"):
        read_dcp_metadata(folder)
    with pytest.raises(sk.errors.UnsafePickleError):
        sk.read(folder)
    assert not target.exists()


def test_scan_follows_stack_global_through_the_memo() -> None:
    data = pickle.dumps([RunsCommand(Path("a")), RunsCommand(Path("b"))], protocol=4)
    assert any(op.name == "STACK_GLOBAL" for op, _, _ in pickletools.genops(data))
    assert scan_globals(data) == [f"{os.system.__module__}.system"]


def test_restricted_load_builds_only_allowed_objects() -> None:
    plain = {"t": (1, 2.5, "x", None, True, 2**70), "l": [1, [2]], "d": {1: -1}}
    for protocol in range(2, 6):
        assert restricted_load(pickle.dumps(plain, protocol=protocol), {}) == plain
    value = {**plain, "b": b"y", "s": {3}, "f": frozenset({4})}  # protocol 4+ has opcodes
    for protocol in (4, 5):
        assert restricted_load(pickle.dumps(value, protocol=protocol), {}) == value
    allowed = {"torch.Size": torch.Size}
    assert restricted_load(pickle.dumps(torch.Size([2, 3]), protocol=4), allowed) == (2, 3)
    with pytest.raises(DisallowedGlobal, match=r"torch\.Size"):
        restricted_load(pickle.dumps(torch.Size([2, 3]), protocol=4), {})
    with pytest.raises(ValueError, match="not a complete pickle"):
        restricted_load(pickle.dumps(value)[:-5], {})
