"""Incremental saves are never stale and never share a single point of failure: bit rot
under an unchanged modification time, sparse writes no version counter sees, files swapped
or deleted at a link's source name, and the independence of the steps that stay."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import lora_state, lora_step

import statekeeper as sk
from statekeeper.checkpoint import save as one_off
from statekeeper.storage import files as storage_files
from statekeeper.testing import assert_state_equal

FROZEN = "tensors-00000.safetensors"  # the frozen base's shard (frozen parameters first)


@pytest.fixture(autouse=True)
def _fresh_trust() -> None:
    one_off.ONE_OFF_CACHE.checked.clear()  # each test starts like a new process (sk.save's)


def shard(run: Path, step: int, name: str = FROZEN) -> Path:
    return run / f"step_{step:09d}" / name


def rot(path: Path) -> None:
    """Flip one bit in the middle of ``path`` in place, its modification time put back (as
    a bad sector leaves it: nothing a fingerprint shows)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns


def inodes(run: Path, step: int) -> set[int]:
    return {f.stat().st_ino for f in (run / f"step_{step:09d}").glob("*.safetensors")}


def test_a_rotten_file_is_never_linked_into_the_next_step(tmp_path: Path) -> None:
    state, adapter, opt = lora_state()
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(3)) as ckpt:
        for step in (1, 2, 3):
            lora_step(adapter, opt)
            ckpt.save(step, state)
        damaged = {shard(tmp_path, s).stat().st_ino for s in (1, 2, 3)}
        for s in (2, 3):  # every copy of the frozen shard (two chains of links)
            rot(shard(tmp_path, s))
        lora_step(adapter, opt)
        info = ckpt.save(4, state)
    assert isinstance(info, sk.CheckpointInfo) and info.reused_files == 0
    assert shard(tmp_path, 4).stat().st_ino not in damaged
    assert [s.ok for s in sk.audit.verify(tmp_path).steps] == [False, False, True]
    fresh, _, _ = lora_state(seed=3)
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(3)) as again:
        assert again.restore_latest(fresh) == 4
    assert_state_equal(dict(fresh["model"].state_dict()), dict(state["model"].state_dict()))


def test_a_rotten_file_in_the_newest_step_leaves_an_older_good_step(tmp_path: Path) -> None:
    state, adapter, opt = lora_state()
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(2)) as ckpt:
        for step in range(1, 6):
            lora_step(adapter, opt)
            ckpt.save(step, state)
    rot(shard(tmp_path, 5))  # one bad sector in the newest step's frozen shard
    fresh, _, _ = lora_state(seed=3)
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(2)) as again, warnings.catch_warnings():
        warnings.simplefilter("ignore", sk.StatekeeperWarning)  # step 5 is skipped
        assert again.restore_latest(fresh) == 4
    assert torch.equal(fresh["model"]["base"].weight, state["model"]["base"].weight)


@pytest.mark.parametrize(
    "keep",
    [
        None,
        sk.KeepLatest(2),
        sk.KeepLatest(3),
        sk.KeepEvery(4) | sk.KeepLatest(1),
        sk.KeepBest(2, metric="loss"),
    ],
    ids=["all", "latest2", "latest3", "every4+latest1", "best2"],
)
def test_a_step_that_stays_shares_no_file_with_the_newest(
    keep: sk.training.Retention | None, tmp_path: Path
) -> None:
    losses = [5.0, 3.0, 4.0, 1.0, 2.0, 6.0, 0.5, 7.0, 0.7, 0.6]
    state, adapter, opt = lora_state()
    reused = 0
    with sk.Checkpointer(tmp_path, keep=keep) as ckpt:
        for step, loss in enumerate(losses, start=1):
            lora_step(adapter, opt)
            info = ckpt.save(step, state, {"loss": loss})
            assert isinstance(info, sk.CheckpointInfo)
            reused += info.reused_files
            steps = [i.step for i in sk.list_checkpoints(tmp_path)]
            if len(steps) < 2:
                continue
            newest = inodes(tmp_path, steps[-1])
            apart = [s for s in steps[:-1] if inodes(tmp_path, s).isdisjoint(newest)]
            assert apart, f"after step {step}, every step of {steps} shares a file with it"
    assert reused >= len(losses) // 2  # still incremental: most saves link the frozen shard
    assert sk.audit.verify(tmp_path).ok


def test_keeping_one_step_links_at_every_save(tmp_path: Path) -> None:
    state, adapter, opt = lora_state()
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1)) as ckpt:
        infos = []
        for step in (1, 2, 3):
            lora_step(adapter, opt)
            infos.append(ckpt.save(step, state))
    assert [i.reused_files for i in infos] == [0, 1, 1]  # no second copy is kept anyway


@pytest.mark.parametrize("how", ["numpy", ".data", "another tensor on its storage"])
def test_a_sparse_write_no_counter_sees_is_saved(how: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024, bias=False)  # 4 MiB: 16 samples of 4 KiB, 256 KiB apart
    model.requires_grad_(False)
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1)) as ckpt:
        for step in (1, 2):
            ckpt.save(step, {"model": model})  # from here on its marks are known
        before = model.weight._version
        where = 3000  # float 3000: bytes 12000-12003, between the first two samples
        if how == "numpy":
            model.weight.numpy()[where // 1024, where % 1024] = 42.0
        elif how == ".data":
            model.weight.data.view(-1)[where] = 42.0
        else:
            other = torch.empty(0).set_(model.weight.untyped_storage())
            other.view(-1)[where] = 42.0
        assert model.weight._version == before  # no counter moved
        ckpt.save(3, {"model": model})
    saved = sk.read(tmp_path)["model"]["weight"]
    assert saved.view(-1)[where] == 42.0
    assert torch.equal(saved, model.weight)
    assert sk.audit.verify(tmp_path).ok


class _AtLink:
    """Runs ``act(source)`` once, at the first link syscall (after the source was checked):
    the moment another process could swap or delete the file at the source's name.
    ``source`` is the path being linked (for a link by descriptor, where its name is)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, act: Any) -> None:
        self.sources: list[Path] = []
        real = os.link

        def link(src: Any, *args: Any, **kwargs: Any) -> None:
            if not self.sources:
                src = os.fspath(src)
                named = os.readlink(src) if src.startswith("/proc/self/fd/") else src
                if kwargs.get("src_dir_fd") is not None:  # a name in that directory
                    named = os.path.join(os.readlink(f"/proc/self/fd/{kwargs['src_dir_fd']}"), src)
                self.sources.append(Path(named))
                act(Path(named))
            real(src, *args, **kwargs)

        # (typing) the module's own import, patched by the test
        monkeypatch.setattr(storage_files.os, "link", link)  # type: ignore[attr-defined]


@pytest.fixture(params=["linkat /proc/self/fd", "no /proc"])
def proc(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Links by descriptor through /proc, or (where there is none) by name, checked after."""
    if request.param == "no /proc":
        monkeypatch.setattr(storage_files, "_PROC_FD", "/nonexistent/proc/self/fd")
    return str(request.param)


def test_a_checked_file_is_linked_with_or_without_proc(proc: str, tmp_path: Path) -> None:
    state, adapter, opt, ckpt = _saved_twice(tmp_path)
    with ckpt:
        lora_step(adapter, opt)
        info = ckpt.save(3, state)
    assert isinstance(info, sk.CheckpointInfo) and info.reused_files == 1
    assert sk.audit.verify(tmp_path).ok


def _saved_twice(run: Path) -> tuple[dict[str, Any], Any, Any, sk.Checkpointer]:
    state, adapter, opt = lora_state()
    ckpt = sk.Checkpointer(run, keep=sk.KeepLatest(2))
    for step in (1, 2):
        lora_step(adapter, opt)
        ckpt.save(step, state)
    return state, adapter, opt, ckpt


def test_a_file_swapped_in_at_the_source_name_is_never_linked(
    proc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, adapter, opt, ckpt = _saved_twice(tmp_path)
    fakes: list[int] = []

    def swap(source: Path) -> None:  # same size, one byte different, replacing the name
        data = bytearray(source.read_bytes())
        data[len(data) // 2] ^= 0x01
        fake = source.with_name("swapped.tmp")
        fake.write_bytes(bytes(data))
        fakes.append(fake.stat().st_ino)
        os.replace(fake, source)

    hook = _AtLink(monkeypatch, swap)
    with ckpt:
        lora_step(adapter, opt)
        ckpt.save(3, state)
    assert [p.name for p in hook.sources] == [FROZEN]
    # the file checked had no other name left once swapped out, so it could not be linked
    # either: the shard was written from memory
    assert shard(tmp_path, 3).stat().st_ino not in fakes
    assert sk.audit.verify(tmp_path, step=3).ok
    got = sk.read(tmp_path, step=3)["model"]["base.weight"]
    assert torch.equal(got, state["model"]["base"].weight)


def test_a_source_deleted_before_the_link_is_written_from_memory(
    proc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, adapter, opt, ckpt = _saved_twice(tmp_path)
    hook = _AtLink(monkeypatch, Path.unlink)  # a user or a cron job cleaning old steps
    with ckpt:
        lora_step(adapter, opt)
        info = ckpt.save(3, state)
    assert [p.name for p in hook.sources] == [FROZEN]
    assert isinstance(info, sk.CheckpointInfo) and info.reused_files == 0
    assert info.written == info.bytes
    assert sk.audit.verify(tmp_path).ok
