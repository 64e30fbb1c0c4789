"""Incremental saves: files identical to the previous step's are reused, never trusted blindly."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import lora_state, lora_step

import statekeeper as sk
from statekeeper.checkpoint import save as one_off
from statekeeper.incremental import reuse as incremental
from statekeeper.storage import files as storage_files


def manifest(run: Path, step: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / f"step_{step:09d}" / "manifest.json").read_text())
    return data


@pytest.fixture(autouse=True)
def _fresh_trust() -> None:
    one_off.ONE_OFF_CACHE.checked.clear()  # each test starts like a new process (sk.save's)


def test_an_unchanged_frozen_shard_is_linked_and_every_step_stays_whole(tmp_path: Path) -> None:
    state, adapter, opt = lora_state()
    infos = []
    with sk.Checkpointer(tmp_path) as ckpt:
        for step in (1, 2, 3, 4):
            lora_step(adapter, opt)
            infos.append(ckpt.save(step, state))
    first, second, third, fourth = infos
    assert first.written == first.bytes and first.reused_files == 0
    # the second save writes whole: the run then holds two copies that share no data
    assert second.written == second.bytes and second.reused_files == 0
    assert third.reused_files == fourth.reused_files == 1
    frozen = third.bytes - third.written
    assert frozen > 256 * 256 * 4  # the frozen weight was not written again
    inodes = {
        s: {f.name: f.stat().st_ino for f in (tmp_path / f"step_{s:09d}").iterdir()}
        for s in (1, 2, 3, 4)
    }
    shared = [n for n in inodes[3] if inodes[3][n] == inodes[1].get(n)]
    assert shared == ["tensors-00000.safetensors"]  # one file, two names
    assert inodes[4]["tensors-00000.safetensors"] == inodes[2]["tensors-00000.safetensors"]
    assert manifest(tmp_path, 3)["reused"] == {
        "tensors-00000.safetensors": "step_000000001/tensors-00000.safetensors"
    }
    listed = {i.step: i for i in sk.list_checkpoints(tmp_path)}
    assert listed[3].written == third.written and listed[3].bytes == third.bytes
    shutil_rmtree(tmp_path / "step_000000001")
    shutil_rmtree(tmp_path / "step_000000002")
    assert sk.audit.verify(tmp_path).ok  # deleting the steps it reused from damages nothing
    fresh, fresh_adapter, fresh_opt = lora_state(seed=5)
    lora_step(fresh_adapter, fresh_opt)
    sk.load(tmp_path, fresh | {"rng": sk.RNGState()})
    for a, b in zip(
        fresh["model"].state_dict().values(), state["model"].state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)


def shutil_rmtree(path: Path) -> None:
    for f in path.iterdir():
        f.unlink()
    path.rmdir()


def test_retention_deletes_steps_without_touching_the_files_others_share(tmp_path: Path) -> None:
    state, adapter, opt = lora_state()
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1)) as ckpt:
        for step in range(1, 5):
            lora_step(adapter, opt)
            ckpt.save(step, state)
    assert [i.step for i in sk.list_checkpoints(tmp_path)] == [4]
    assert sk.audit.verify(tmp_path).ok
    assert (tmp_path / "step_000000004" / "tensors-00000.safetensors").stat().st_nlink == 1


def test_a_damaged_previous_file_is_not_reused_but_written_anew(tmp_path: Path) -> None:
    state, adapter, opt = lora_state()
    sk.save(tmp_path, state, step=1)
    frozen = tmp_path / "step_000000001" / "tensors-00000.safetensors"
    data = bytearray(frozen.read_bytes())
    data[-1] ^= 0xFF  # bit rot in step 1's copy
    frozen.write_bytes(bytes(data))
    lora_step(adapter, opt)
    info = sk.save(tmp_path, state, step=2)
    assert info.reused_files == 0 and info.written == info.bytes
    assert "reused" not in manifest(tmp_path, 2)
    report = sk.audit.verify(tmp_path)
    assert [s.ok for s in report.steps] == [False, True]  # step 2 did not inherit the damage


def _source_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the file names whose bytes are read before they are linked."""
    reads: list[str] = []
    real = storage_files.OpenedFile.chunks

    def chunks(self: storage_files.OpenedFile, size: int = 16 << 20) -> Any:
        reads.append(os.path.basename(os.readlink(f"/proc/self/fd/{self._fd}")))
        return real(self, size)

    monkeypatch.setattr(storage_files.OpenedFile, "chunks", chunks)
    return reads


def test_every_linked_file_is_read_and_checked_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _source_reads(monkeypatch)
    state, adapter, opt = lora_state()
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1)) as ckpt:
        for step in (1, 2, 3):
            lora_step(adapter, opt)
            ckpt.save(step, state)
    # written by this process, unchanged since: read all the same (a bad sector changes
    # nothing a fingerprint shows)
    assert reads == ["tensors-00000.safetensors"] * 2


def test_trust_marks_trusts_a_file_checked_once_while_it_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _source_reads(monkeypatch)
    trusting = sk.Incremental.TRUST_MARKS
    state, adapter, opt = lora_state()
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), incremental=trusting) as ckpt:
        for step in (1, 2, 3):
            lora_step(adapter, opt)
            ckpt.save(step, state)
        assert reads == []  # written by this process: its bytes are those it hashed
    # a new Checkpointer (its own cache, as in a new process): read once, then trusted
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), incremental=trusting) as again:
        for step in (4, 5):
            lora_step(adapter, opt)
            again.save(step, state)
    assert reads == ["tensors-00000.safetensors"]
    assert sk.audit.verify(tmp_path).ok


def test_write_all_writes_every_file(tmp_path: Path) -> None:
    state, adapter, opt = lora_state()
    with sk.Checkpointer(tmp_path, incremental=sk.Incremental.WRITE_ALL) as ckpt:
        for step in (1, 2):
            lora_step(adapter, opt)
            info = ckpt.save(step, state)
    assert isinstance(info, sk.CheckpointInfo)
    assert info.reused_files == 0 and info.written == info.bytes
    with pytest.raises(sk.errors.InvalidArgumentError, match="incremental must be"):
        sk.Checkpointer(tmp_path / "other", incremental="yes")


def test_background_saves_reuse_too(tmp_path: Path) -> None:
    state, adapter, opt = lora_state()
    with sk.Checkpointer(tmp_path, blocking=False) as ckpt:
        for step in (1, 2, 3):
            lora_step(adapter, opt)
            ckpt.save(step, state)
        info = ckpt.wait()
    assert info is not None and info.reused_files == 1
    assert sk.audit.verify(tmp_path).ok


def _two_steps(run: Path) -> tuple[dict[str, Any], Any, Any]:
    """A LoRA state saved as steps 1 and 2 (both written whole): step 3 links from step 1."""
    state, adapter, opt = lora_state()
    for step in (1, 2):
        lora_step(adapter, opt)
        sk.save(run, state, step=step)
    return state, adapter, opt


@pytest.mark.parametrize(
    "code", [errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOENT, errno.EIO, errno.ENOSPC]
)
def test_a_link_that_fails_for_any_reason_writes_the_file(
    code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code))

    state, adapter, opt = _two_steps(tmp_path)
    # (typing) the module's own import, patched by the test
    monkeypatch.setattr(storage_files.os, "link", broken)  # type: ignore[attr-defined]
    lora_step(adapter, opt)
    info = sk.save(tmp_path, state, step=3)
    assert info.reused_files == 0 and info.written == info.bytes
    assert sk.audit.verify(tmp_path).ok
    assert sk.audit.list_partial(tmp_path) == []


@pytest.mark.parametrize("kind", ["memory", "fsspec"])
def test_other_storages_reuse_through_their_own_copy(kind: str, tmp_path: Path) -> None:
    storage: Any = (
        sk.storage.MemoryStorage(name=f"memory://inc-{os.getpid()}")
        if kind == "memory"
        else sk.storage.FsspecStorage(f"memory://inc-{os.getpid()}-{tmp_path.name}")
    )
    state, adapter, opt = lora_state()
    for step in (1, 2):
        lora_step(adapter, opt)
        info = sk.save(storage, state, step=step)
    assert info.reused_files == 1
    assert sk.audit.verify(storage).ok
    got = sk.read(storage)
    assert torch.equal(got["model"]["base.weight"], state["model"].base.weight)


def test_a_manifest_that_marks_an_unknown_file_reused_is_corrupt(tmp_path: Path) -> None:
    from statekeeper.format.manifest import Manifest

    state, adapter, opt = lora_state()
    sk.save(tmp_path, state, step=1)
    lora_step(adapter, opt)
    sk.save(tmp_path, state, step=2)
    data = (tmp_path / "step_000000002" / "manifest.json").read_bytes()
    parsed = Manifest.from_bytes("m", data)
    bad = Manifest(**{**parsed.__dict__, "reused": {"nope.safetensors": "step_1/x"}})
    with pytest.raises(sk.CorruptCheckpointError, match="unknown files reused"):
        Manifest.from_bytes("m", bad.to_bytes())


def _checksums(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Records the tensor names of every shard checksummed from memory."""
    calls: list[tuple[str, ...]] = []
    real = incremental.shard_checksum

    def counted(tensors: dict[str, torch.Tensor], shard: Any) -> str:
        calls.append(tuple(tensors))
        return real(tensors, shard)

    monkeypatch.setattr(incremental, "shard_checksum", counted)
    return calls


@pytest.mark.parametrize("mode", [sk.Incremental.REUSE, sk.Incremental.TRUST_MARKS])
def test_a_frozen_shard_is_hashed_at_every_save_unless_marks_are_trusted(
    mode: sk.Incremental, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _checksums(monkeypatch)
    state, adapter, opt = lora_state()
    keep = sk.KeepLatest(1)
    with sk.Checkpointer(tmp_path, keep=keep, blocking=False, incremental=mode) as ckpt:
        for step in (1, 2, 3, 4):  # marks taken in the caller
            lora_step(adapter, opt)
            ckpt.save(step, state)
        ckpt.wait()
    frozen = [c for c in calls if "model/base.weight" in c]
    if mode is sk.Incremental.REUSE:
        assert len(frozen) == 3  # the proof that the bytes are equal, at every save
    else:
        assert frozen == []  # its marks from step 1 on: the checksum is known without hashing
    assert sk.list_checkpoints(tmp_path)[-1].reused_files == 1
    assert sk.audit.verify(tmp_path).ok


@pytest.mark.parametrize("how", ["in place", "through .data", "a new parameter"])
def test_a_frozen_tensor_that_changed_is_written_however_it_changed(
    how: str, tmp_path: Path
) -> None:
    state, adapter, opt = lora_state()
    base = state["model"].base
    with sk.Checkpointer(tmp_path) as ckpt:
        for step in (1, 2):
            lora_step(adapter, opt)
            ckpt.save(step, state)
        with torch.no_grad():
            if how == "in place":
                base.weight.add_(1.0)
            elif how == "through .data":  # a version counter of its own: the samples see it
                base.weight.data.copy_(torch.randn_like(base.weight))
            else:
                base.weight = torch.nn.Parameter(base.weight + 1.0, requires_grad=False)
        lora_step(adapter, opt)
        info = ckpt.save(3, state)
    assert isinstance(info, sk.CheckpointInfo) and info.reused_files == 0
    saved = sk.read(tmp_path)["model"]["base.weight"]
    assert torch.equal(saved, base.weight)
    assert sk.audit.verify(tmp_path).ok


def test_tensors_that_stay_unchanged_get_shards_of_their_own_that_are_reused(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    model.register_buffer("table", torch.randn(128, 128))
    model.table.mul_(2.0)  # written once, in place, then left alone (not a parameter)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"model": model, "optim": opt}
    infos = []
    for step in (1, 2, 3, 4):
        model(torch.randn(2, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        infos.append(sk.save(tmp_path, state, step=step))
    data = manifest(tmp_path, 4)
    table_file = data["tensors"]["model/table"]["file"]
    weight_file = data["tensors"]["model/weight"]["file"]
    assert table_file != weight_file  # grouped apart once it was seen unchanged
    assert table_file in data["reused"] and weight_file not in data["reused"]
    assert infos[3].written < infos[3].bytes - 128 * 128 * 4
    assert torch.equal(sk.read(tmp_path)["model"]["table"], model.table)


@pytest.mark.parametrize("how", ["non-contiguous, through .data", "reshaped through .data"])
def test_writes_that_no_version_counter_sees_are_still_saved(how: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    if how.startswith("non-contiguous"):
        model.weight = torch.nn.Parameter(torch.randn(16, 16).t(), requires_grad=False)
    model.requires_grad_(False)
    sk.save(tmp_path, {"model": model}, step=1)
    sk.save(tmp_path, {"model": model}, step=2)  # the marks are known from here on
    if how.startswith("non-contiguous"):
        model.weight.data.copy_(torch.zeros(16, 16))  # a counter of its own: no mark sees it
    else:
        model.weight.data = model.weight.data.view(8, 32)  # same memory, same counter
    sk.save(tmp_path, {"model": model}, step=3)
    assert torch.equal(sk.read(tmp_path)["model"]["weight"], model.weight)
    assert sk.audit.verify(tmp_path).ok


def test_a_frozen_tensor_that_others_view_is_checksummed_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _checksums(monkeypatch)
    frozen = torch.zeros(1024)
    holder = torch.nn.Module()
    holder.frozen = torch.nn.Parameter(frozen, requires_grad=False)
    holder.part = torch.nn.Parameter(frozen.data[:16])  # trainable, viewing the frozen one
    opt = torch.optim.SGD([holder.part], lr=1.0)
    for step in (1, 2, 3, 4):
        holder.part.sum().backward()
        opt.step()
        opt.zero_grad()
        trusting = sk.Incremental.TRUST_MARKS
        sk.save(tmp_path, {"model": holder, "optim": opt}, step=step, incremental=trusting)
    # saves 3 and 4 (save 2 writes whole: nothing to link from): no mark used
    assert len([c for c in calls if "model/frozen" in c]) == 2
    assert torch.equal(sk.read(tmp_path)["model"]["frozen"], holder.frozen)


def test_a_frozen_shard_is_checksummed_from_its_bytes_again_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _checksums(monkeypatch)
    state, adapter, opt = lora_state()
    trusting = sk.Incremental.TRUST_MARKS
    with sk.Checkpointer(tmp_path, keep=sk.KeepLatest(1), incremental=trusting) as ckpt:
        for step in range(1, incremental.RECHECK_EVERY + 3):
            lora_step(adapter, opt)
            ckpt.save(step, state)
    frozen = [c for c in calls if "model/base.weight" in c]
    assert len(frozen) == 1  # once in RECHECK_EVERY saves, the marks are not enough


def test_a_state_dict_hook_that_makes_new_tensors_is_checksummed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    model.requires_grad_(False)
    model.register_buffer("scale", torch.ones(()))

    def scaled(module: Any, sd: dict[str, Any], prefix: str, local: Any) -> None:
        sd[prefix + "weight"] = module.weight * module.scale  # a new tensor every time

    model._register_state_dict_hook(scaled)
    for step in (1, 2, 3):
        model.scale.fill_(float(step))
        sk.save(tmp_path, {"model": model}, step=step)
    assert torch.equal(sk.read(tmp_path)["model"]["weight"], model.weight * 3.0)
    assert sk.audit.verify(tmp_path).ok


def test_a_frozen_tensor_that_shares_its_storage_with_another_gets_no_mark(
    tmp_path: Path,
) -> None:
    model = torch.nn.Module()
    model.frozen = torch.nn.Parameter(torch.zeros(4096), requires_grad=False)
    model.register_buffer("bits", model.frozen.data.view(torch.int32))  # same bytes
    for step in (1, 2, 3):
        model.bits[step] += 7  # a write the frozen parameter's counter never sees
        sk.save(tmp_path, {"model": model}, step=step)
    got = sk.read(tmp_path)["model"]
    assert torch.equal(got["frozen"], model.frozen) and torch.equal(got["bits"], model.bits)


def test_a_frozen_conjugate_parameter_saves(tmp_path: Path) -> None:
    model = torch.nn.Module()
    model.z = torch.nn.Parameter(torch.randn(8, dtype=torch.complex64).conj(), False)
    for step in (1, 2):
        sk.save(tmp_path, {"model": model}, step=step)
    assert torch.equal(sk.read(tmp_path)["model"]["z"], model.z.resolve_conj())
