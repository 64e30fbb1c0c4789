"""save / load / read / list_checkpoints: behaviour of the public API."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import make_model, trained

import statekeeper as sk
from statekeeper.storage.local import LocalStorage
from statekeeper.testing import assert_state_equal


def test_model_and_optimizer_round_trip_into_fresh_objects(tmp_path: Path) -> None:
    model, opt = trained(0)
    sk.save(tmp_path, {"model": model, "opt": opt}, step=5, metrics={"loss": 0.25})
    fresh_model, fresh_opt = trained(1, steps=0)
    info = sk.load(tmp_path, {"model": fresh_model, "opt": fresh_opt})
    assert info.step == 5
    assert info.path.endswith("step_000000005")
    assert_state_equal(fresh_model.state_dict(), model.state_dict())
    assert_state_equal(fresh_opt.state_dict(), opt.state_dict())


class Grid(torch.nn.Module):
    """A buffer built with meshgrid/expand: its own state_dict cannot be loaded by torch."""

    def __init__(self) -> None:
        super().__init__()
        _, xs = torch.meshgrid(torch.arange(3.0), torch.arange(4.0), indexing="ij")
        self.register_buffer("xs", xs)
        self.register_buffer("row", torch.arange(4.0).expand(3, 4))
        self.proj = torch.nn.Linear(4, 2)


def test_self_overlapping_buffers_load_where_torch_fails(tmp_path: Path) -> None:
    saved = Grid()
    with pytest.raises(RuntimeError, match="more than one element"):
        Grid().load_state_dict(saved.state_dict())
    sk.save(tmp_path, {"grid": saved}, step=1)
    fresh = Grid()
    with pytest.warns(sk.StatekeeperWarning, match="grid/row") as caught:
        info = sk.load(tmp_path, {"grid": fresh})
    assert caught[0].filename == __file__  # attributed to the caller's line
    assert set(info.replaced) == {"grid/row", "grid/xs"}
    assert_state_equal(fresh.state_dict(), saved.state_dict())
    assert fresh.row.stride() == (4, 1)
    assert "row" in dict(fresh.named_buffers())


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 6)
        self.head = torch.nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight


def test_tied_weights_are_saved_once_and_stay_tied(tmp_path: Path) -> None:
    model = Tied()
    with torch.no_grad():
        model.embed.weight.mul_(3)
    info = sk.save(tmp_path, {"model": model}, step=1)
    untied_bytes = 2 * 10 * 6 * 4
    assert info.bytes < untied_bytes + 2000
    manifest = (Path(info.path) / "manifest.json").read_text()
    assert '"model/head.weight":{"base":"model/embed.weight"' in manifest
    fresh = Tied()
    sk.load(tmp_path, {"model": fresh})
    assert fresh.head.weight is fresh.embed.weight
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    plain = sk.read(tmp_path)["model"]
    assert plain["head.weight"].data_ptr() == plain["embed.weight"].data_ptr()


def test_views_of_one_storage_share_memory_after_read(tmp_path: Path) -> None:
    base = torch.arange(24.0).reshape(4, 6)
    state = {"x": {"base": base, "col": base[:, 2], "t": base.t(), "tail": base[2:]}}
    sk.save(tmp_path, state, step=1)
    back = sk.read(tmp_path)["x"]
    assert_state_equal(back, state["x"])
    back["base"][3, 2] = -1.0
    assert back["col"][3] == -1.0 and back["t"][2, 3] == -1.0 and back["tail"][1, 2] == -1.0


def test_views_without_a_covering_member_store_the_span(tmp_path: Path) -> None:
    storage = torch.arange(20.0)
    state = {"a": storage[2:6], "b": storage[4:9].view(5, 1)}
    sk.save(tmp_path, state, step=1)
    back = sk.read(tmp_path)
    assert_state_equal(back, state)
    back["a"][3] = 100.0
    assert back["b"][1, 0] == 100.0


DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.complex64, torch.uint16, torch.uint32, torch.uint64,
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_safetensors_dtype_round_trips(tmp_path: Path, dtype: torch.dtype) -> None:
    src = torch.arange(-6, 6, dtype=torch.float32).reshape(3, 4)
    full = (
        src.to(dtype)
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
        else (src.abs().to(dtype))
    )
    state = {
        "t": {
            "full": full,
            "scalar": full[1, 1].clone(),
            "empty": full[:0],
            "strided": full.t(),
            "expanded": full[0].expand(5, 4),
        }
    }
    sk.save(tmp_path, state, step=1)
    assert_state_equal(sk.read(tmp_path), state)


def test_mismatches_are_all_reported_and_nothing_is_loaded(tmp_path: Path) -> None:
    sk.save(tmp_path, {"model": make_model(0), "extra": 1}, step=1)
    other = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5), torch.nn.Linear(5, 5)
    )
    other[0].double()
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(sk.KeyMismatchError) as info:
        sk.load(tmp_path, {"model": other, "missing_entry": {}})
    problems = "\n".join(info.value.problems)
    assert "model/0.weight: dtype torch.float32 in checkpoint, torch.float64 live" in problems
    assert "model/2.weight: shape (4, 16) in checkpoint, (5, 16) live" in problems
    assert "model/3.weight: missing from the checkpoint" in problems
    assert "missing_entry: missing from the checkpoint" in problems
    assert "extra: in the checkpoint but not in the live state" in problems
    assert isinstance(info.value, KeyError)
    assert_state_equal(dict(other.state_dict()), before)


@pytest.mark.parametrize(
    ("strict", "raises"),
    [
        (sk.Strict.EXACT, True),
        (sk.Strict.ALLOW_MISSING, True),
        (sk.Strict.ALLOW_UNEXPECTED, True),
        (sk.Strict.PARTIAL, False),
    ],
)
def test_strictness_opt_outs(tmp_path: Path, strict: sk.Strict, raises: bool) -> None:
    saved = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2), "b": torch.nn.Linear(2, 2)})
    sk.save(tmp_path, {"m": saved}, step=1)
    live = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2), "c": torch.nn.Linear(2, 2)})
    if raises:
        with pytest.raises(sk.KeyMismatchError):
            sk.load(tmp_path, {"m": live}, strict=strict)
    else:
        sk.load(tmp_path, {"m": live}, strict=strict)
        assert torch.equal(live["a"].weight, saved["a"].weight)


def test_strict_must_be_the_enum(tmp_path: Path) -> None:
    sk.save(tmp_path, {"x": 1}, step=1)
    with pytest.raises(sk.errors.InvalidArgumentError, match="Strict"):
        sk.load(tmp_path, {"x": 0}, strict=False)


def test_plain_values_load_in_place_or_come_back(tmp_path: Path) -> None:
    counter = sk.Value(41)
    counter.value += 1
    meta = {"name": "run", "lr": 0.1}
    history = [1, 2]
    tensor = torch.arange(3.0)
    sk.save(
        tmp_path,
        {"counter": counter, "meta": meta, "history": history, "epoch": 3, "tensor": tensor},
        step=1,
    )
    live_meta: dict[str, Any] = {}
    live_history: list[Any] = []
    live_counter, live_tensor = sk.Value(0), torch.zeros(3)
    info = sk.load(
        tmp_path,
        {
            "counter": live_counter,
            "meta": live_meta,
            "history": live_history,
            "epoch": 0,
            "tensor": live_tensor,
        },
    )
    assert live_counter.value == 42
    assert live_meta == meta and live_history == history
    assert torch.equal(live_tensor, tensor)
    assert info.values == {"epoch": 3}


def test_existing_step_is_never_overwritten_silently(tmp_path: Path) -> None:
    sk.save(tmp_path, {"x": 1}, step=3)
    with pytest.raises(sk.errors.StepExistsError, match="overwrite=True") as info:
        sk.save(tmp_path, {"x": 2}, step=3)
    assert isinstance(info.value, FileExistsError)
    assert sk.read(tmp_path)["x"] == 1
    sk.save(tmp_path, {"x": 2}, step=3, overwrite=True)
    assert sk.read(tmp_path)["x"] == 2
    assert sorted(os.listdir(tmp_path)) == [".statekeeper.lock", "step_000000003"]


def test_missing_steps_are_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(sk.StepNotFoundError, match="no committed checkpoint"):
        sk.load(tmp_path, {"x": 0})
    sk.save(tmp_path, {"x": 1}, step=3)
    with pytest.raises(FileNotFoundError, match="committed steps: 3"):
        sk.read(tmp_path, step=4)


def test_newest_step_is_loaded_by_default_and_steps_sort_numerically(tmp_path: Path) -> None:
    for step in (9, 10, 2, 1_000_000_000):
        sk.save(tmp_path, {"x": step}, step=step, metrics={"step": step})
    infos = sk.list_checkpoints(tmp_path)
    assert [i.step for i in infos] == [2, 9, 10, 1_000_000_000]
    assert infos[1].metrics == {"step": 9}
    assert all(i.bytes > 0 and i.created is not None and i.error is None for i in infos)
    assert sk.read(tmp_path)["x"] == 1_000_000_000
    assert sk.read(tmp_path, step=9)["x"] == 9
    assert sk.read(tmp_path / "step_000000010")["x"] == 10


def test_unsupported_values_write_nothing(tmp_path: Path) -> None:
    with pytest.raises(sk.errors.UnsupportedValueError, match=r"opt/extra/fn"):
        sk.save(tmp_path, {"opt": {"extra": {"fn": lambda: 1}}}, step=1)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []


def test_a_state_dict_that_raises_commits_nothing(tmp_path: Path) -> None:
    class Broken:
        def state_dict(self) -> dict[str, Any]:
            raise RuntimeError("boom")

        def load_state_dict(self, state: Any) -> None:
            pass

    with pytest.raises(RuntimeError, match="boom"):
        sk.save(tmp_path, {"b": Broken()}, step=1)
    assert sk.list_checkpoints(tmp_path) == [] and sk.audit.list_partial(tmp_path) == []


def test_frozen_parameters_get_shards_of_their_own(tmp_path: Path) -> None:
    model = make_model(0)
    model[0].requires_grad_(False)
    info = sk.save(tmp_path, {"model": model}, step=1)
    manifest = (Path(info.path) / "manifest.json").read_text()
    assert '"model/0.weight":{"file":"tensors-00000.safetensors"' in manifest
    assert '"model/2.weight":{"file":"tensors-00001.safetensors"' in manifest


def test_shards_are_capped_in_size(tmp_path: Path) -> None:
    state = {f"t{i}": torch.full((256,), float(i)) for i in range(10)}
    info = sk.save(tmp_path, state, step=1, shard_bytes=2048)
    shards = sorted(p.name for p in Path(info.path).glob("tensors-*.safetensors"))
    assert len(shards) == 5
    assert_state_equal(sk.read(tmp_path), state)


def test_a_second_writer_gets_a_clear_error(tmp_path: Path) -> None:
    with LocalStorage(tmp_path).writer_lock():
        with pytest.raises(sk.errors.WriterConflictError, match=f"pid {os.getpid()}"):
            sk.save(tmp_path, {"x": 1}, step=1)
        with pytest.raises(BlockingIOError):
            sk.audit.remove_partial(tmp_path)
    sk.save(tmp_path, {"x": 1}, step=1)


def test_remove_partial_removes_only_abandoned_saves(tmp_path: Path) -> None:
    sk.save(tmp_path, {"x": 1}, step=1)
    (tmp_path / "step_000000002.partial-0123abcd").mkdir()
    (tmp_path / "step_000000002.partial-0123abcd" / "tensors-00000.safetensors").write_bytes(b"x")
    (tmp_path / "notes").mkdir()
    assert [p.step for p in sk.audit.list_partial(tmp_path)] == [2]
    assert sk.audit.remove_partial(tmp_path) == ["step_000000002.partial-0123abcd"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["notes", "step_000000001"]


@pytest.mark.parametrize("step", [-1, 1.0, True, "3"])
def test_bad_steps_are_rejected(tmp_path: Path, step: Any) -> None:
    with pytest.raises(sk.errors.InvalidArgumentError, match="step"):
        sk.save(tmp_path, {"x": 1}, step=step)


@pytest.mark.parametrize("name", ["", "a/b", "$x", 3])
def test_bad_state_names_are_rejected(tmp_path: Path, name: Any) -> None:
    with pytest.raises(sk.errors.InvalidArgumentError, match="state name"):
        sk.save(tmp_path, {name: 1}, step=1)


@pytest.mark.parametrize(
    "value",
    [
        torch.zeros(2, dtype=torch.complex128),
        torch.zeros(2, dtype=torch.float8_e8m0fnu),
    ],
    ids=str,
)
def test_dtypes_safetensors_cannot_store_are_refused_before_writing(
    tmp_path: Path, value: torch.Tensor
) -> None:
    with pytest.raises(
        sk.errors.UnsupportedValueError, match=r"state at m/w holds tensors of dtype"
    ):
        sk.save(tmp_path, {"m": {"w": value}}, step=1)
    assert sk.list_checkpoints(tmp_path) == [] and sk.audit.list_partial(tmp_path) == []


def test_retyped_views_of_one_storage_are_stored_separately(tmp_path: Path) -> None:
    x = torch.arange(4.0)
    state = {"a": x, "b": x.view(torch.int32)}
    sk.save(tmp_path, state, step=1)
    assert_state_equal(sk.read(tmp_path), state)


def test_a_manifest_moved_to_another_step_directory_is_refused(tmp_path: Path) -> None:
    sk.save(tmp_path, {"x": 1}, step=7)
    (tmp_path / "step_000000007").rename(tmp_path / "step_000000008")
    with pytest.raises(sk.CorruptCheckpointError, match="for step 7, not 8"):
        sk.read(tmp_path)


def test_wrapped_modules_save_and_load_without_prefixes(tmp_path: Path) -> None:
    model = make_model(0)
    compiled = torch.compile(model)  # never called: only the wrapper's keys matter
    # (typing) a compiled model, typed as a function by torch.compile
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)  # type: ignore[attr-defined]
    # (typing) a compiled model, typed as a function by torch.compile
    assert next(iter(compiled.state_dict())).startswith("_orig_mod.")  # type: ignore[attr-defined]
    sk.save(tmp_path, {"model": compiled, "opt": opt}, step=1)
    saved = sk.read(tmp_path)
    assert set(saved["model"]) == set(model.state_dict())
    assert saved["opt"]["param_groups"][0]["params"][0] == "model/0.bias"
    bare = make_model(1)
    sk.load(tmp_path, {"model": bare, "opt": torch.optim.SGD(bare.parameters(), lr=0.1)})
    assert_state_equal(bare.state_dict(), model.state_dict())
    wrapped = torch.nn.DataParallel(make_model(2))
    sk.load(tmp_path, {"model": wrapped, "opt": torch.optim.SGD(wrapped.parameters(), lr=0.1)})
    assert_state_equal(wrapped.module.state_dict(), model.state_dict())


def test_save_reports_progress_in_bytes(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    state = {"a": torch.zeros(1000), "b": torch.ones(24, dtype=torch.float64)}
    sk.save(tmp_path, state, step=1, progress=lambda done, total: calls.append((done, total)))
    total = sum(p.stat().st_size for p in (tmp_path / "step_000000001").glob("*.safetensors"))
    assert calls and calls[-1] == (total, total)
    assert all(a <= b for (a, _), (b, _) in itertools.pairwise(calls))
    with pytest.raises(sk.errors.InvalidArgumentError, match="progress"):
        sk.save(tmp_path, state, step=2, blocking=False, progress=lambda d, t: None)
