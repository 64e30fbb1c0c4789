"""Backend differences are capabilities the Storage protocol declares, never class checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import statekeeper as sk
from statekeeper.averaging.offline import average_checkpoints
from statekeeper.catalog.location import locate
from statekeeper.storage.base import Storage
from statekeeper.storage.fsspec import FsspecStorage
from statekeeper.storage.local import LocalStorage
from statekeeper.storage.memory import MemoryStorage
from statekeeper.storage.optional import Capabilities, capabilities_of

pytest.importorskip("fsspec")


def _backends(tmp_path: Path) -> dict[str, Storage]:
    return {
        "local": LocalStorage(tmp_path / "run"),
        "fsspec": FsspecStorage(f"memory://caps-{tmp_path.name}"),
        "memory": MemoryStorage(),
    }


EXPECTED = {
    "local": Capabilities(local_reads=True, directories=True),
    "fsspec": Capabilities(local_reads=False, directories=False),
    "memory": Capabilities(local_reads=False, directories=False),
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_every_backend_declares_its_capabilities(tmp_path: Path, kind: str) -> None:
    storage = _backends(tmp_path)[kind]
    assert isinstance(storage, Storage)
    # (typing) only the remote storages the test builds have capabilities
    assert storage.capabilities == EXPECTED[kind]  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        # (typing) only the remote storages the test builds have capabilities
        storage.capabilities.local_reads = True  # type: ignore[attr-defined]


def test_the_protocol_documents_each_capability() -> None:
    documented = (Capabilities.__doc__ or "") + (Storage.__doc__ or "")
    for field in dataclasses.fields(Capabilities):
        assert f"``{field.name}``" in documented, field.name
    assert "capabilities" in (Storage.__doc__ or "")


def test_exists_follows_the_run_directory(tmp_path: Path) -> None:
    local = LocalStorage(tmp_path / "run")
    assert not local.exists()
    (tmp_path / "run").mkdir()
    assert local.exists()
    memory = MemoryStorage()
    assert not memory.exists()
    sk.save(memory, {"w": torch.ones(2)}, step=1)
    assert memory.exists()


class _MemoryWithDirectories(MemoryStorage):
    capabilities = Capabilities(local_reads=False, directories=True)


def test_a_missing_run_directory_is_reported_where_the_backend_has_directories() -> None:
    with pytest.raises(sk.StepNotFoundError, match="holds no committed checkpoint"):
        locate(MemoryStorage(), None)  # no directories: an empty run
    with pytest.raises(sk.StepNotFoundError, match="memory://run does not exist"):
        locate(_MemoryWithDirectories(), None)


class _RemoteLocal(LocalStorage):
    capabilities = Capabilities(local_reads=False, directories=True)


class _MappedMemory(MemoryStorage):
    capabilities = Capabilities(local_reads=True, directories=False)


def test_offline_averaging_asks_the_capability_not_the_class(tmp_path: Path) -> None:
    runs = [tmp_path / "a", tmp_path / "b"]
    for i, run in enumerate(runs):
        sk.save(run, {"model": {"w": torch.full((3,), float(i))}}, step=1)
    with pytest.raises(sk.errors.InvalidArgumentError, match="local checkpoints only"):
        average_checkpoints([_RemoteLocal(run) for run in runs], tmp_path / "out")
    memories = [_MappedMemory(name=f"memory://{i}") for i in range(2)]
    for i, storage in enumerate(memories):
        sk.save(storage, {"model": {"w": torch.full((3,), float(i))}}, step=1)
    info = average_checkpoints(memories, tmp_path / "out")
    assert torch.equal(sk.read(info.path)["model"]["w"], torch.full((3,), 0.5))


class _EarlierBackend:
    """A backend written for an earlier release: the protocol's members without the
    optional ``capabilities`` and ``exists`` (it delegates to a memory storage)."""

    def __init__(self) -> None:
        self._inner = MemoryStorage()

    def __getattr__(self, name: str) -> object:
        if name in ("capabilities", "exists"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def describe(self, entry: str = "", name: str = "") -> str:
        return self._inner.describe(entry, name)

    def entries(self) -> list[str]:
        return self._inner.entries()

    def files(self, entry: str) -> list[str]:
        return self._inner.files(entry)

    def read(self, entry: str, name: str) -> object:
        return self._inner.read(entry, name)

    def size(self, entry: str, name: str) -> int:
        return self._inner.size(entry, name)

    def begin(self, entry: str, *, replace: bool = False) -> object:
        return self._inner.begin(entry, replace=replace)

    def remove(self, entry: str) -> None:
        self._inner.remove(entry)

    def writer_lock(self) -> object:
        return self._inner.writer_lock()


def test_a_backend_without_the_optional_members_still_saves_and_loads() -> None:
    backend = _EarlierBackend()
    assert isinstance(backend, Storage)
    assert capabilities_of(backend) == Capabilities()
    sk.save(backend, {"w": torch.arange(3.0)}, step=1)
    live = {"w": torch.zeros(3)}
    assert sk.load(backend, live).step == 1
    assert torch.equal(live["w"], torch.arange(3.0))
