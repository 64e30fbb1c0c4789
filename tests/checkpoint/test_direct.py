"""The direct copy into live modules: same outcome as ``load_state_dict``, taken only where
that is provable, and the pinned-staging copier's chunking (run here on CPU buffers)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import statekeeper as sk
from statekeeper import lanes
from statekeeper.catalog.location import locate
from statekeeper.checkpoint import direct
from statekeeper.checkpoint.direct import _Staging, copy_pairs, direct_pairs
from statekeeper.checkpoint.gc_pause import collector_paused
from statekeeper.checkpoint.reader import PendingStep


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.body = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.LayerNorm(6))
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor(2.0))
        self.register_buffer("cache", torch.zeros(3), persistent=False)
        self.t = nn.Parameter(torch.randn(5, 4).t())  # a non-contiguous live parameter
        self.norm = nn.InstanceNorm1d(6, affine=True, track_running_stats=True)


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=gen))
            else:
                t.fill_(seed)
    return module


def _saved_state(tmp_path: Path, module: nn.Module) -> dict[str, Any]:
    sk.save(tmp_path, {"model": module}, step=1)
    state: dict[str, Any] = sk.read(tmp_path)["model"]
    return state


def test_direct_copy_equals_load_state_dict(tmp_path: Path) -> None:
    source = _randomize(Tied(), 1)
    saved = _saved_state(tmp_path, source)
    by_torch, by_us = _randomize(Tied(), 2), _randomize(Tied(), 2)
    cache = by_us.cache.clone()
    by_torch.load_state_dict(saved)
    pairs = direct_pairs(by_us, saved)
    assert pairs is not None, "BatchNorm/InstanceNorm/LayerNorm models take the fast path"
    assert len(pairs) == len(saved) - 1  # the tied weight is copied once
    copy_pairs(pairs)
    for (key, a), b in zip(by_torch.state_dict().items(), by_us.state_dict().values(), strict=True):
        assert torch.equal(a, b), key
        assert torch.equal(a, source.state_dict()[key]), key
    assert by_us.head.weight is by_us.embed.weight
    assert not by_us.t.is_contiguous() and torch.equal(by_us.t, source.t)
    assert torch.equal(by_us.cache, cache)  # non-persistent: untouched


def test_load_takes_the_direct_path_and_keeps_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _randomize(Tied(), 3)
    sk.save(tmp_path, {"model": source}, step=1)
    live = _randomize(Tied(), 4)
    before = {n: p for n, p in live.named_parameters()}
    pointers = {n: p.data_ptr() for n, p in before.items()}

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("load_state_dict was called on a default module tree")

    monkeypatch.setattr(Tied, "load_state_dict", refuse, raising=False)
    monkeypatch.setattr(direct, "_DEFAULT_TOP", Tied.load_state_dict)  # still "default"
    sk.load(tmp_path, {"model": live})
    for name, p in live.named_parameters():
        assert p is before[name] and p.data_ptr() == pointers[name], name
        assert torch.equal(p, source.get_parameter(name)), name


class CustomLoad(nn.Linear):
    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        state_dict[prefix + "weight"] = state_dict[prefix + "weight"] * 0 + 7
        super()._load_from_state_dict(state_dict, prefix, *args)


class WithExtra(nn.Linear):
    def get_extra_state(self) -> Any:
        return {"tag": 1}

    def set_extra_state(self, state: Any) -> None:
        self.tag = state["tag"]


class OwnTop(nn.Linear):
    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self.loaded_by_own_method = True
        return super().load_state_dict(*args, **kwargs)


def _pre_hooked() -> nn.Module:
    m = nn.Sequential(nn.Linear(3, 3))
    m[0].register_load_state_dict_pre_hook(lambda *a, **k: None)
    return m


def _post_hooked() -> nn.Module:
    m = nn.Sequential(nn.Linear(3, 3))
    m.register_load_state_dict_post_hook(lambda *a, **k: None)
    return m


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Sequential(CustomLoad(3, 3)),
        lambda: nn.Sequential(WithExtra(3, 3)),
        lambda: OwnTop(3, 3),
        _pre_hooked,
        _post_hooked,
    ],
    ids=["custom _load_from_state_dict", "extra state", "own load_state_dict", "pre", "post"],
)
def test_modules_with_their_own_loading_go_through_load_state_dict(
    tmp_path: Path, make: Callable[[], nn.Module]
) -> None:
    saved = _saved_state(tmp_path, make())
    live = make()
    assert direct_pairs(live, saved) is None
    sk.load(tmp_path, {"model": live})  # and load gives what torch's own loading gives
    expected = make()
    expected.load_state_dict(saved)
    for key, value in expected.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(live.state_dict()[key], value), key


def test_custom_loading_still_runs_through_load(tmp_path: Path) -> None:
    sk.save(tmp_path, {"model": nn.Sequential(CustomLoad(3, 3))}, step=1)
    live = nn.Sequential(CustomLoad(3, 3))
    sk.load(tmp_path, {"model": live})
    assert torch.all(live[0].weight == 7)


@pytest.mark.parametrize(
    "change",
    ["extra key", "missing key", "dtype", "shape", "not a tensor", "swap", "lazy", "sd hook"],
)
def test_anything_unusual_falls_back(change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    live: nn.Module = nn.Sequential(nn.Linear(3, 2))
    saved: dict[str, Any] = {k: v.clone() for k, v in live.state_dict().items()}
    assert direct_pairs(live, saved) is not None
    if change == "extra key":
        saved["1.weight"] = torch.zeros(1)
    elif change == "missing key":
        del saved["0.bias"]
    elif change == "dtype":
        saved["0.bias"] = saved["0.bias"].double()
    elif change == "shape":
        saved["0.bias"] = torch.zeros(3)
    elif change == "not a tensor":
        saved["0.bias"] = [0.0, 0.0]
    elif change == "swap":
        monkeypatch.setattr(torch.__future__, "get_swap_module_params_on_conversion", lambda: True)
    elif change == "lazy":
        live = nn.Sequential(nn.LazyLinear(2))
    elif change == "sd hook":  # state_dict() keys may differ from what loading visits
        live[0].register_state_dict_pre_hook(lambda *a, **k: None)
    assert direct_pairs(live, saved) is None


@pytest.mark.parametrize("size", [1, 24, 64, 100, 4096])
def test_staging_copies_every_value_whatever_the_buffer_size(size: int) -> None:
    gen = torch.Generator().manual_seed(0)
    sources = [
        torch.randn(7, generator=gen).to(torch.bfloat16),  # odd byte counts: alignment
        torch.randn(3, 5, generator=gen, dtype=torch.float64),
        torch.randint(0, 100, (33,), generator=gen),
        torch.randn(0),
        torch.randn(200, generator=gen),  # larger than most buffers: sent in pieces
        torch.randn(40, 30, generator=gen),
    ]
    dests = [torch.zeros_like(s) for s in sources]
    dests[-1] = torch.zeros(30, 40).t()  # large and non-contiguous: copied directly
    stage = _Staging(torch.device("cpu"), size)
    stage.copy(list(zip(dests, sources, strict=True)))
    for i, (d, s) in enumerate(zip(dests, sources, strict=True)):
        assert torch.equal(d, s), i
    assert all(b.numel() == stage.size >= size for b in stage.buffers)  # reused, never grown


def test_damaged_file_is_reported_before_any_key_mismatch(tmp_path: Path) -> None:
    sk.save(tmp_path, {"model": nn.Linear(4, 4)}, step=1)
    shard = next((tmp_path / "step_000000001").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    live = nn.Linear(4, 5)  # a shape mismatch too
    before = live.weight.detach().clone()
    with pytest.raises(sk.CorruptCheckpointError, match="checksum"):
        sk.load(tmp_path, {"model": live})
    assert torch.equal(live.weight, before)


def test_pending_step_leaves_no_work_or_thread_behind_on_error(tmp_path: Path) -> None:
    """A read that fails midway ends its checksum jobs (none still reads the mapped files)
    and adds no thread: the verifying thread is the process's, kept (statekeeper/lanes.py)."""
    sk.save(tmp_path, {"t": torch.zeros(1 << 21)}, step=1)  # large enough for the thread
    sk.read(tmp_path)  # the verify lane's thread starts here, once
    threads = set(threading.enumerate())
    for _ in range(3):
        with pytest.raises(RuntimeError, match="stop"), PendingStep(locate(tmp_path, None)):
            raise RuntimeError("stop")
        lanes.drain("verify")  # its jobs have ended (cancelled, or finished by close())
    assert set(threading.enumerate()) == threads


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_collector_is_paused_during_load_and_restored(
    tmp_path: Path, collector_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    model = nn.Linear(3, 3)
    sk.save(tmp_path, {"model": model}, step=1)
    original = direct.copy_pairs

    def spy(pairs: list[direct.Pair]) -> None:
        seen.append(gc.isenabled())
        original(pairs)

    monkeypatch.setattr("statekeeper.checkpoint.adapters.copy_pairs", spy)
    sk.load(tmp_path, {"model": model})
    assert seen == [False] and gc.isenabled()
    with pytest.raises(sk.KeyMismatchError):
        sk.load(tmp_path, {"model": nn.Linear(3, 4)})
    assert gc.isenabled()
    gc.disable()
    sk.load(tmp_path, {"model": model})
    assert not gc.isenabled()  # left as the caller had it


def test_collector_pause_nests_across_threads(collector_on: None) -> None:
    inner_entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            inner_entered.set()
            release.wait(10)

    with collector_paused():
        worker = threading.Thread(target=other)
        worker.start()
        inner_entered.wait(10)
    assert not gc.isenabled()  # the other thread is still inside
    release.set()
    worker.join()
    assert gc.isenabled()


class _Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _parametrized() -> nn.Module:
    from torch.nn.utils import parametrize

    m = nn.Linear(4, 4)
    parametrize.register_parametrization(m, "weight", _Scale())
    return m


@pytest.mark.parametrize(
    ("make", "direct_expected"),
    [
        (lambda: nn.LSTM(4, 5, num_layers=2), True),
        (lambda: nn.MultiheadAttention(8, 2), True),
        (lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16), True),
        (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.GroupNorm(2, 4)), True),
        (_parametrized, True),
        (lambda: nn.utils.spectral_norm(nn.Linear(4, 4)), False),  # load pre-hook
    ],
    ids=["lstm", "mha", "transformer", "conv-bn", "parametrized", "spectral-norm"],
)
def test_common_modules_load_as_torch_loads_them(
    tmp_path: Path, make: Callable[[], nn.Module], direct_expected: bool
) -> None:
    torch.manual_seed(0)
    source = _randomize(make(), 5)
    saved = _saved_state(tmp_path, source)
    torch.manual_seed(1)
    live, reference = make(), make()
    assert (direct_pairs(live, saved) is not None) is direct_expected
    sk.load(tmp_path, {"model": live})
    reference.load_state_dict(saved)
    assert live.state_dict().keys() == reference.state_dict().keys()
    for key, value in reference.state_dict().items():
        assert torch.equal(live.state_dict()[key], value), key


def test_damaged_file_is_reported_before_a_planning_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sk.save(tmp_path, {"model": nn.Linear(4, 4)}, step=1)
    shard = next((tmp_path / "step_000000001").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))

    def broken(*args: object) -> None:
        raise RuntimeError("planning failed")

    monkeypatch.setattr("statekeeper.checkpoint.adapters.direct_pairs", broken)
    with pytest.raises(sk.CorruptCheckpointError, match="checksum"):
        sk.load(tmp_path, {"model": nn.Linear(4, 4)})
    shard.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]))  # intact again
    with pytest.raises(RuntimeError, match="planning failed"):
        sk.load(tmp_path, {"model": nn.Linear(4, 4)})


class KeepsCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.register_buffer("cache", torch.zeros(2))


class DropsCache(KeepsCache):
    """A child whose state_dict() leaves out a buffer that loading would visit."""

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        out = super().state_dict(*args, **kwargs)
        out.pop(kwargs.get("prefix", "") + "cache", None)
        return out


class OnlySetsExtra(nn.Linear):
    def set_extra_state(self, state: Any) -> None:
        self.extra = state


def _instance_patched() -> nn.Module:
    m = nn.Sequential(nn.Linear(2, 2))
    original = m[0]._load_from_state_dict

    def doubled(state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        original(state_dict, prefix, *args)
        with torch.no_grad():
            m[0].weight.mul_(2)

    # (typing) a test double of the module's own hook
    m[0]._load_from_state_dict = doubled  # type: ignore[assignment, method-assign]
    return m


def _saved_and_live(tmp_path: Path, make: Callable[[], nn.Module]) -> tuple[Any, nn.Module]:
    sk.save(tmp_path, {"model": make()}, step=1)
    saved, live = sk.read(tmp_path)["model"], make()
    assert direct_pairs(live, saved) is None
    return saved, live


def test_a_loading_method_set_on_an_instance_runs(tmp_path: Path) -> None:
    saved, live = _saved_and_live(tmp_path, _instance_patched)
    reference = _instance_patched()
    reference.load_state_dict(saved)
    sk.load(tmp_path, {"model": live})
    assert torch.equal(live[0].weight, reference[0].weight)
    assert torch.equal(live[0].weight, saved["0.weight"] * 2)


def test_a_child_state_dict_override_keeps_the_key_check(tmp_path: Path) -> None:
    sk.save(tmp_path, {"model": nn.Sequential(KeepsCache())}, step=1)  # holds 0.cache
    live = nn.Sequential(DropsCache())  # whose state_dict() does not list it
    assert direct_pairs(live, sk.read(tmp_path)["model"]) is None
    with pytest.raises(sk.KeyMismatchError, match=r"0\.cache: unexpected"):
        sk.load(tmp_path, {"model": live})


def test_set_extra_state_alone_is_left_to_torch(tmp_path: Path) -> None:
    saved, live = _saved_and_live(tmp_path, lambda: OnlySetsExtra(2, 2))
    with pytest.raises(RuntimeError, match="_extra_state"):
        OnlySetsExtra(2, 2).load_state_dict(saved)
    with pytest.raises(sk.errors.LoadStateError, match="_extra_state"):
        sk.load(tmp_path, {"model": live})


class Rebuilds:
    """A Stateful entry that replaces a module's parameter when it is loaded."""

    def __init__(self, module: nn.Linear) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return {"n": 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.weight = nn.Parameter(torch.zeros(3, 3))


def test_a_parameter_replaced_by_an_earlier_entry_still_gets_its_value(tmp_path: Path) -> None:
    source = nn.Linear(3, 3, bias=False)
    sk.save(tmp_path, {"a": Rebuilds(source), "model": source}, step=1)
    live = nn.Linear(3, 3, bias=False)
    sk.load(tmp_path, {"a": Rebuilds(live), "model": live})
    assert torch.equal(live.weight, source.weight)


def test_staging_buffers_stay_on_the_host_under_another_default_device() -> None:
    with torch.device("meta"):
        stage = _Staging(torch.device("cpu"), 256)
        dst, src = torch.zeros(4, device="cpu"), torch.arange(4.0, device="cpu")
        stage.copy([(dst, src)])
    assert [b.device.type for b in stage.buffers] == ["cpu", "cpu"]
    assert torch.equal(dst, src)
