"""clear_state on what real code holds: other models' tensors in declared attributes, a
submodule cleared on its own, random constants of __init__, dtype-cast models, namedtuple
and defaultdict states, inference tensors, and rules that fail or clear their children."""

from __future__ import annotations

import collections
import warnings
from typing import Any, NamedTuple

import pytest
import torch

import statekeeper as sk


class Holder(torch.nn.Module):
    statekeeper_transient = ("refs", "grads", "output")

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.refs: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.output: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.output = x  # declared transient, but the caller's: never emptied
        return self.fc(x)


def test_declared_attributes_never_empty_what_is_not_the_modules() -> None:
    teacher = torch.nn.BatchNorm1d(4)
    teacher(torch.randn(8, 4))
    stats = teacher.running_mean.clone()
    model = Holder()
    x = torch.randn(2, 4)
    model(x).sum().backward()
    assert model.fc.weight.grad is not None
    grad = model.fc.weight.grad.clone()
    model.refs.append(teacher.running_mean)  # another model's buffer: dropped
    model.grads.append(model.fc.weight.grad)  # the model's own gradient: left alone
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, report=report)
    assert torch.equal(teacher.running_mean, stats) and x.shape == (2, 4)
    assert model.fc.weight.grad is not None and torch.equal(model.fc.weight.grad, grad)
    assert model.refs == [] and model.output is None and len(model.grads) == 1
    assert {c.action for c in report.cleared} == {sk.clearing.ClearAction.RELEASED}


def test_a_submodule_cleared_alone_keeps_a_tied_view_of_an_outside_parameter() -> None:
    class Head(torch.nn.Module):
        def __init__(self, emb: torch.nn.Embedding) -> None:
            super().__init__()
            self.wt = emb.weight.t()  # tied to a parameter outside this subtree

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h @ self.wt

    emb = torch.nn.Embedding(5, 4)
    model = torch.nn.ModuleDict({"emb": emb, "head": Head(emb)})
    sk.clearing.clear_state(model["head"])
    assert model["head"].wt.shape == (4, 5)

    class Stats(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mean", torch.ones(3))

    class Peeker(torch.nn.Module):
        statekeeper_transient = ("seen",)

        def __init__(self, stats: Stats) -> None:
            super().__init__()
            self.seen = [stats.mean]

        def statekeeper_clear_state(self) -> None:
            sk.clearing.clear_state(self)  # the generic part sees the whole model's buffers

    stats = Stats()
    sk.clearing.clear_state(torch.nn.ModuleDict({"stats": stats, "peek": Peeker(stats)}))
    assert torch.equal(stats.mean, torch.ones(3))


def test_like_keeps_random_constants_and_gives_back_none() -> None:
    class Features(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 2)
            self.proj = torch.randn(4, 8)  # random features: a constant, other per instance
            self.anchor = {"w": self.fc.weight.detach().clone()}  # an L2-SP anchor
            self.past: list[torch.Tensor] | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x @ self.proj)
            self.past = [y] if self.past is None else [*self.past, y]
            return y

    torch.manual_seed(0)
    model = Features()
    proj, anchor = model.proj, model.anchor
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = model(x)
        model(x)
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, like=Features(), report=report)
    assert model.proj is proj and model.anchor is anchor and model.past is None
    assert [c.path for c in report.cleared] == ["past"]
    with torch.no_grad():
        assert torch.equal(model(x), expected) and len(model.past) == 1


def test_a_dtype_cast_model_and_inference_tensors_reset_cleanly() -> None:
    def build() -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))

    net = build().to(torch.bfloat16)
    net(torch.randn(8, 4, dtype=torch.bfloat16))
    stats = net[1].running_mean.clone()
    sk.clearing.clear_state(net, include=sk.clearing.ClearInclude.BATCH_STATE, like=build())
    assert torch.equal(net[1].running_mean, stats)  # running statistics: never per-batch

    class Membrane(torch.nn.Module):
        statekeeper_batch_state = ("v",)

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("v", torch.zeros(1, 4))
            self.hidden: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.v = self.v + x
            self.hidden = self.v * 2
            return self.hidden

    model = Membrane()
    with torch.inference_mode():
        model(torch.ones(3, 4))
    sk.clearing.clear_state(model, include=sk.clearing.ClearInclude.BATCH_STATE, like=Membrane())
    assert model.v.shape == (1, 4) and not model.v.any() and model.hidden is None


class State(NamedTuple):
    h: torch.Tensor
    c: torch.Tensor


def test_like_rebuilds_namedtuples_and_defaultdicts_and_rejects_meta() -> None:
    class Stateful(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.state = State(torch.zeros(1), torch.zeros(1))
            self.store: collections.defaultdict[str, torch.Tensor] = collections.defaultdict(
                lambda: torch.zeros(0)
            )

        def forward(self, x: torch.Tensor) -> None:
            y = self.fc(x)
            self.state = State(y, y * 2)
            self.store["last"] = y

    model = Stateful()
    model(torch.randn(2, 4))
    sk.clearing.clear_state(model, like=Stateful())
    assert isinstance(model.state, State) and model.state.h.shape == (1,)
    assert isinstance(model.store, collections.defaultdict) and dict(model.store) == {}
    with torch.device("meta"):
        meta = Stateful()
    with pytest.raises(sk.errors.InvalidArgumentError, match=r"'fc.weight' is on the meta device"):
        sk.clearing.clear_state(model, like=meta)


def test_failing_rules_and_bad_declarations_say_where_before_anything_changes() -> None:
    calls: list[str] = []

    class First(torch.nn.Module):
        def statekeeper_clear_state(self) -> None:
            calls.append("first")

    class Failing(torch.nn.Module):
        def statekeeper_clear_state(self) -> None:
            raise KeyError("cache")

    class Wrong(torch.nn.Module):
        statekeeper_transient = None

    with pytest.raises(sk.errors.InvalidArgumentError, match=r"Failing at '1'.*KeyError: 'cache'"):
        sk.clearing.clear_state(torch.nn.Sequential(First(), Failing()))
    calls.clear()
    with pytest.raises(
        sk.errors.InvalidArgumentError, match="statekeeper_transient must be a tuple"
    ):
        sk.clearing.clear_state(torch.nn.Sequential(First(), Wrong()))
    assert calls == []  # checked before any rule ran


def test_rules_clearing_children_clear_each_once_and_report_what_they_freed() -> None:
    calls: list[str] = []

    class Leaf(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.output: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.output = self.fc(x)
            return self.output

    class Container(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = Leaf(), Leaf()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

        def __len__(self) -> int:  # falsy, as an empty cache is
            return 0

        def statekeeper_clear_state(self) -> None:
            calls.append("container")
            for child in (self.a, self.b):
                sk.clearing.clear_state(child)  # Torch7's containers clear their children

    model = torch.nn.Sequential(Container())
    model(torch.randn(2, 4))
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(
        model, report=report, mode="release", like=torch.nn.Sequential(Container())
    )
    assert calls == ["container"]
    assert [(c.path, c.action, c.bytes) for c in report.cleared] == [
        ("0.a.output", sk.clearing.ClearAction.RELEASED, 32),
        ("0.b.output", sk.clearing.ClearAction.RELEASED, 32),
        ("0", sk.clearing.ClearAction.CUSTOM, 0),
    ]


def test_a_parameter_free_cache_of_another_modules_output_is_only_dropped() -> None:
    class KeepsActivation(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.act = torch.relu(x)
            return self.act

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), KeepsActivation())
    out = model(torch.randn(2, 4))
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, report=report)
    assert out.shape == (2, 4) and model[1].act is None  # its graph is not the module's
    extra: dict[str, Any] = {"mode": sk.clearing.ClearMode.EMPTY}
    model(torch.randn(2, 4))
    sk.clearing.clear_state(model[1], **extra)
    assert model[1].act is None


def test_a_cell_keeping_its_input_declares_it_borrowed_and_the_callers_states_survive() -> None:
    class Cell(torch.nn.Module):
        statekeeper_borrowed = ("last_in",)  # its input: from the caller, or itself before

        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            self.last_in = h
            return torch.tanh(self.lin(h))

    cell = Cell()
    h, states = torch.zeros(1, 4), []
    for _ in range(3):
        h = cell(h)
        states.append(h)
    sk.clearing.clear_state(cell)
    assert [s.shape for s in states] == [(1, 4)] * 3 and cell.last_in is None


def test_like_leaves_filled_tables_cast_constants_and_weight_norm_alone() -> None:
    class Calibrated(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("min_val", torch.tensor([]))  # filled by calibration
            self.register_buffer("v", torch.zeros(1, 3))  # follows the batch

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.min_val = x.min(0).values
            self.v = self.v + x
            return x

    model = Calibrated()
    model(torch.randn(5, 3))
    calibrated = model.min_val.clone()
    sk.clearing.clear_state(model, like=Calibrated(), include=sk.clearing.ClearInclude.BATCH_STATE)
    assert torch.equal(model.min_val, calibrated) and model.v.shape == (1, 3)

    class Features(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.proj = torch.randn(4, 4)

        def _apply(self, fn: Any, recurse: bool = True) -> Features:
            self.proj = fn(self.proj)  # the constant follows the model's dtype
            return super()._apply(fn, recurse)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x @ self.proj)

    cast = Features().double()
    proj = cast.proj
    sk.clearing.clear_state(cast, like=Features())
    assert cast.proj is proj and cast(torch.ones(1, 4, dtype=torch.float64)).shape == (1, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old weight_norm, still in use
        normed = torch.nn.utils.weight_norm(torch.nn.Linear(4, 4))
        fresh = torch.nn.utils.weight_norm(torch.nn.Linear(4, 4))
    weight = normed.weight
    sk.clearing.clear_state(normed, like=fresh)
    assert normed.weight is weight  # computed from weight_g and weight_v: machinery


def test_a_childs_rule_runs_once_when_a_parents_rule_clears_it() -> None:
    calls: list[str] = []

    class Child(torch.nn.Module):
        def statekeeper_clear_state(self) -> None:
            calls.append("child")

    class Parent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = Child()

        def statekeeper_clear_state(self) -> None:
            calls.append("parent")
            sk.clearing.clear_state(self.c)

    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(Parent(), report=report)
    assert calls == ["parent", "child"]
    assert [c.path for c in report.cleared] == ["c", ""]


def test_nested_tensors_are_dropped_and_declarations_are_checked() -> None:
    class Ragged(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, xs: list[torch.Tensor]) -> None:
            self.a = self.fc(xs[0]) * 1
            self.z = torch.nested.as_nested_tensor([self.fc(x) for x in xs])

    model = Ragged()
    model([torch.randn(2, 4), torch.randn(3, 4)])
    a = model.a
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, report=report)
    assert model.a is None and model.z is None and a.numel() == 0
    assert {c.path: c.action for c in report.cleared} == {
        "a": sk.clearing.ClearAction.EMPTIED, "z": sk.clearing.ClearAction.RELEASED
    }  # fmt: skip

    class SavesIt(torch.nn.Module):
        statekeeper_transient = ("k",)

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("k", torch.zeros(2))

    with pytest.raises(sk.errors.InvalidArgumentError, match=r"persistent buffer 'k'.*batch_state"):
        sk.clearing.clear_state(SavesIt())

    class Tied(torch.nn.Module):
        statekeeper_owned = ("weight",)

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2))

    with pytest.raises(sk.errors.InvalidArgumentError, match=r"parameter 'weight'.*never cleared"):
        sk.clearing.clear_state(Tied())


def test_like_resets_a_declared_position_counter() -> None:
    class KV(torch.nn.Module):
        statekeeper_transient = ("keys", "pos")

        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.keys: torch.Tensor | None = None
            self.pos = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            k = self.proj(x)
            self.keys = k if self.keys is None else torch.cat([self.keys, k])
            self.pos += x.shape[0]
            return self.keys.sum(0) * self.pos

    torch.manual_seed(0)
    model, fresh = KV(), KV()
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(2, 4)
    model(x)
    model(x)
    sk.clearing.clear_state(model)
    assert model.pos == 4  # without a fresh instance, a number cannot be known
    sk.clearing.clear_state(model, like=KV())
    assert model.pos == 0 and torch.equal(model(x), fresh(x))


def test_a_declared_cache_buffer_goes_back_to_none_and_the_callers_copy_survives() -> None:
    class Rotary(torch.nn.Module):
        statekeeper_transient = ("cache",)

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", None, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.cache is None or self.cache.shape != x.shape:
                self.cache = torch.cos(torch.arange(x.numel(), dtype=x.dtype)).view_as(x)
            return x * self.cache

    model = Rotary()
    model(torch.ones(2, 3))
    kept = model.cache
    assert kept is not None
    values = kept.clone()
    sk.clearing.clear_state(model)
    assert model.cache is None and "cache" in model._buffers  # registered, as __init__ left
    assert torch.equal(kept, values)  # no history, not owned: the caller's copy survives
    model(torch.ones(2, 3))
    sk.clearing.clear_state(model, like=Rotary())
    assert model.cache is None


def test_per_channel_scales_and_declared_results_of_init_forwards() -> None:
    class PerChannel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.ones(1))  # becomes (C,) on first use

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.scale = x.abs().amax(0)
            return x / self.scale

    model = PerChannel()
    model(torch.randn(4, 3))
    scale = model.scale.clone()
    sk.clearing.clear_state(model, like=PerChannel(), include=sk.clearing.ClearInclude.BATCH_STATE)
    assert torch.equal(model.scale, scale)  # a per-channel scale: the model's, not the batch's

    class Probed(torch.nn.Module):
        statekeeper_transient = ("last",)

        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.last = self.lin(torch.zeros(64, 4))  # a shape-inference forward in __init__

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.last = self.lin(x)
            return self.last

    probed = Probed()
    probed(torch.ones(2, 4))
    sk.clearing.clear_state(
        probed, like=Probed()
    )  # declared: cleared, given back what __init__ left
    assert probed.last is not None and probed.last.shape == (64, 4)
    assert probed.last.grad_fn is None  # a copy, without the fresh instance's graph


def test_values_given_back_take_the_models_dtype() -> None:
    class Hidden(torch.nn.Module):
        statekeeper_transient = ("h",)

        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.h = torch.zeros(1, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.h = torch.tanh(self.lin(x) + self.h)
            return self.h

    model = Hidden().to(torch.bfloat16)
    model.h = model.h.to(torch.bfloat16)
    model(torch.ones(1, 4, dtype=torch.bfloat16))
    sk.clearing.clear_state(model, like=Hidden())
    assert model.h.dtype == torch.bfloat16 and not model.h.any()


def test_values_given_back_keep_their_own_dtype_under_autocast_and_float64() -> None:
    class Cell(torch.nn.Module):
        statekeeper_transient = ("h", "table")

        def __init__(self) -> None:
            super().__init__()
            self.rec = torch.nn.Linear(4, 4)
            self.h = torch.zeros(1, 4)
            self.table = (torch.zeros(4), torch.zeros((), dtype=torch.float64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.h = self.rec(self.h + x)
            self.table = (self.h[0], self.table[1] + 1)
            return self.h

    model = Cell()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.ones(1, 4))
    assert model.h.dtype == torch.bfloat16  # the leftover's dtype, not the model's
    sk.clearing.clear_state(model, like=Cell())
    assert model.h.dtype == torch.float32 and model.table[1].dtype == torch.float64
    assert model(torch.ones(1, 4)).dtype == torch.float32


def test_a_subclass_keeping_a_declared_batch_buffer_as_an_attribute_clears_it() -> None:
    class LIF(torch.nn.Module):
        statekeeper_batch_state = ("mem",)

        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.register_buffer("mem", torch.zeros(1, 4))

    class FastLIF(LIF):
        def __init__(self) -> None:
            super().__init__()
            del self.mem
            self.mem: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                self.mem = self.fc(x) if self.mem is None else self.mem * 0.5 + self.fc(x)
            return self.mem

    model = FastLIF()
    model(torch.ones(2, 4))
    sk.clearing.clear_state(
        model
    )  # declared per-batch state, kept unregistered: cleared as transient
    assert model.mem is None
