"""Run directories behind URLs: ``memory://`` through fsspec, ``file://`` as local storage."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from tests.conftest import trained

import statekeeper as sk
from statekeeper.catalog.location import resolve_storage
from statekeeper.cli.main import main as cli
from statekeeper.storage.fsspec import INCOMPLETE
from statekeeper.testing import assert_state_equal


@pytest.fixture
def url() -> str:
    return f"memory://runs/{uuid.uuid4().hex}"


def state() -> dict[str, Any]:
    model, opt = trained(seed=3)
    return {"model": model, "optim": opt, "step": 7}


def test_memory_url_saves_lists_and_restores(url: str) -> None:
    saved = state()
    sk.save(url, saved, step=1)
    sk.save(url, saved, step=2, metrics={"loss": 0.5})
    infos = sk.list_checkpoints(url)
    assert [i.step for i in infos] == [1, 2]
    assert infos[1].path == f"{url}/step_000000002" and infos[1].metrics == {"loss": 0.5}
    model, opt = trained(seed=9)
    live = {"model": model, "optim": opt, "step": 0}
    info = sk.load(url, live)
    assert info.step == 2 and info.values["step"] == 7
    assert_state_equal(model.state_dict(), saved["model"].state_dict())
    assert_state_equal(sk.read(f"{url}/step_000000001")["optim"], sk.read(url, step=1)["optim"])


def test_step_without_its_manifest_is_not_committed(url: str) -> None:
    sk.save(url, state(), step=1)
    fs = fsspec.filesystem("memory")
    root = url.removeprefix("memory://")
    fs.pipe(f"{root}/step_000000002/tensors-00000.safetensors", b"half a file")
    assert [i.step for i in sk.list_checkpoints(url)] == [1]
    assert [p.name for p in sk.audit.list_partial(url)] == ["step_000000002" + INCOMPLETE]
    assert sk.load(url, {"model": trained()[0]}, strict=sk.Strict.PARTIAL).step == 1
    assert sk.audit.remove_partial(url) == ["step_000000002" + INCOMPLETE]
    assert not fs.exists(f"{root}/step_000000002")


class _FailingOpen:
    """Wraps an fsspec file system: the ``n``-th file opened for writing fails half-way."""

    def __init__(self, fs: Any, n: int) -> None:
        self._fs = fs
        self._left = n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        f = self._fs.open(path, mode, **kw)
        if "w" in mode:
            self._left -= 1
            if self._left == 0:
                real_write = f.write

                def write(data: Any) -> int:
                    real_write(bytes(memoryview(data)[:10]))
                    raise OSError(5, "injected failure")

                f.write = write
        return f


@pytest.mark.parametrize("failing", [1, 2])  # the shard, then the manifest (commit marker)
def test_write_failing_half_way_commits_nothing(url: str, failing: int) -> None:
    sk.save(url, state(), step=1)
    storage = sk.storage.FsspecStorage(url)
    storage.fs = _FailingOpen(storage.fs, failing)
    with pytest.raises(sk.errors.StorageError, match="injected failure"):  # every file written
        sk.save(storage, state(), step=2, incremental=sk.Incremental.WRITE_ALL)
    assert [i.step for i in sk.list_checkpoints(url)] == [1]
    assert sk.audit.list_partial(url) == []  # the aborted save cleaned up after itself
    assert sk.load(url, {"model": trained()[0]}, strict=sk.Strict.PARTIAL).step == 1


def test_overwrite_replaces_a_committed_step(url: str) -> None:
    sk.save(url, {"x": torch.zeros(3)}, step=1)
    with pytest.raises(sk.errors.StepExistsError):
        sk.save(url, {"x": torch.ones(3)}, step=1)
    sk.save(url, {"x": torch.ones(3)}, step=1, overwrite=True)
    assert torch.equal(sk.read(url)["x"], torch.ones(3))


def test_checkpointer_over_a_url_applies_retention(url: str) -> None:
    with sk.Checkpointer(url, keep=sk.KeepLatest(2)) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, {"x": torch.full((2,), float(step))})
    assert [i.step for i in sk.list_checkpoints(url)] == [2, 3]
    with sk.Checkpointer(url) as ckpt:
        live = {"x": torch.zeros(2)}
        assert ckpt.restore_latest(live) == 3
    assert torch.equal(live["x"], torch.full((2,), 3.0))


def test_file_url_is_crash_safe_local_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path}/run"
    assert isinstance(resolve_storage(url), sk.storage.LocalStorage)
    sk.save(url, state(), step=1)
    assert [i.step for i in sk.list_checkpoints(url)] == [1]
    assert (tmp_path / "run" / "step_000000001" / "manifest.json").is_file()
    storage = sk.storage.LocalStorage(tmp_path / "run")
    txn_class = type(storage.begin("probe"))
    storage.remove(next(e for e in storage.entries() if e.startswith("probe")))
    real = txn_class.write_chunks

    def failing(self: Any, name: str, chunks: Any) -> None:
        if name == "manifest.json":
            raise OSError(28, "No space left on device")
        real(self, name, chunks)

    monkeypatch.setattr(txn_class, "write_chunks", failing)
    with pytest.raises(OSError, match="No space"):
        sk.save(url, state(), step=2)
    monkeypatch.undo()
    assert [i.step for i in sk.list_checkpoints(url)] == [1]
    assert sk.audit.list_partial(url) == []
    assert sk.read(url)["step"] == 7


def test_cli_accepts_urls(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    sk.save(url, state(), step=4)
    for args in (["ls", url], ["verify", url], ["inspect", f"{url}/step_000000004"]):
        code = cli.main([*args, "--json"], standalone_mode=False)
        assert code in (None, 0), args
        assert "step_000000004" in capsys.readouterr().out or args[0] == "inspect"


def test_unknown_scheme_says_what_to_install() -> None:
    with pytest.raises(sk.errors.InvalidArgumentError, match="install"):
        sk.list_checkpoints("nosuchproto://bucket/run")


def test_bare_root_url_names_steps_under_it() -> None:
    fs = fsspec.filesystem("memory")
    try:
        sk.save("memory://", {"x": torch.ones(2)}, step=123456)
        info = next(i for i in sk.list_checkpoints("memory://") if i.step == 123456)
        assert info.path == "memory://step_000123456"
        assert torch.equal(sk.read("memory://step_000123456")["x"], torch.ones(2))
    finally:
        fs.rm("/step_000123456", recursive=True)


def test_fsspec_runs_open_only_regular_files(tmp_path: Path) -> None:
    """The same rules as local runs, through fsspec's local file system: a FIFO as a
    manifest never blocks, a link as a shard is refused, the older step still loads."""
    from tests.helpers.hostile import SHARD, finishes, replace_with_fifo, replace_with_link

    for step in (1, 2, 3):
        sk.save(tmp_path, {"w": torch.full((2,), float(step))}, step=step)
    replace_with_fifo(tmp_path / "step_000000003" / "manifest.json")
    replace_with_link(tmp_path / "step_000000002" / SHARD, "/dev/zero")
    url = f"local://{tmp_path}"
    infos = finishes(lambda: sk.list_checkpoints(url))
    assert infos is None
    listed = {i.step: i.error for i in sk.list_checkpoints(url)}
    assert listed[1] is None and listed[2] is None and "not a regular file" in listed[3]
    for step, needle in ((3, "of type 'other'"), (2, "is a symbolic link")):
        error = finishes(lambda s=step: sk.read(url, step=s))
        assert isinstance(error, sk.CorruptCheckpointError) and needle in str(error), error
    assert torch.equal(sk.read(url, step=1)["w"], torch.full((2,), 1.0))
