"""clear_state on what real code holds: other models' tensors in declared attributes, a
submodule cleared on its own, random constants of __init__, dtype-cast models, namedtuple
and defaultdict states, inference tensors, and rules that fail or clear their children."""

from __future__ import annotations

import collections
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
    report = sk.ClearReport()
    sk.clear_state(model, report=report)
    assert torch.equal(teacher.running_mean, stats) and x.shape == (2, 4)
    assert model.fc.weight.grad is not None and torch.equal(model.fc.weight.grad, grad)
    assert model.refs == [] and model.output is None and len(model.grads) == 1
    assert {c.action for c in report.cleared} == {sk.ClearAction.RELEASED}


def test_a_submodule_cleared_alone_keeps_a_tied_view_of_an_outside_parameter() -> None:
    class Head(torch.nn.Module):
        def __init__(self, emb: torch.nn.Embedding) -> None:
            super().__init__()
            self.wt = emb.weight.t()  # tied to a parameter outside this subtree

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h @ self.wt

    emb = torch.nn.Embedding(5, 4)
    model = torch.nn.ModuleDict({"emb": emb, "head": Head(emb)})
    sk.clear_state(model["head"])
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
            sk.clear_state(self)  # the generic part sees the whole model's buffers

    stats = Stats()
    sk.clear_state(torch.nn.ModuleDict({"stats": stats, "peek": Peeker(stats)}))
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
    report = sk.ClearReport()
    sk.clear_state(model, like=Features(), report=report)
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
    sk.clear_state(net, include=sk.ClearInclude.BATCH_STATE, like=build())
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
    sk.clear_state(model, include=sk.ClearInclude.BATCH_STATE, like=Membrane())
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
    sk.clear_state(model, like=Stateful())
    assert isinstance(model.state, State) and model.state.h.shape == (1,)
    assert isinstance(model.store, collections.defaultdict) and dict(model.store) == {}
    with torch.device("meta"):
        meta = Stateful()
    with pytest.raises(sk.InvalidArgumentError, match=r"'fc.weight' is on the meta device"):
        sk.clear_state(model, like=meta)


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

    with pytest.raises(sk.InvalidArgumentError, match=r"Failing at '1'.*KeyError: 'cache'"):
        sk.clear_state(torch.nn.Sequential(First(), Failing()))
    calls.clear()
    with pytest.raises(sk.InvalidArgumentError, match="statekeeper_transient must be a tuple"):
        sk.clear_state(torch.nn.Sequential(First(), Wrong()))
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
                sk.clear_state(child)  # Torch7's containers clear their children

    model = torch.nn.Sequential(Container())
    model(torch.randn(2, 4))
    report = sk.ClearReport()
    sk.clear_state(model, report=report, mode="release", like=torch.nn.Sequential(Container()))
    assert calls == ["container"]
    assert [(c.path, c.action, c.bytes) for c in report.cleared] == [
        ("0.a.output", sk.ClearAction.RELEASED, 32),
        ("0.b.output", sk.ClearAction.RELEASED, 32),
        ("0", sk.ClearAction.CUSTOM, 0),
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
    report = sk.ClearReport()
    sk.clear_state(model, report=report)
    assert out.shape == (2, 4) and model[1].act is None  # its graph is not the module's
    extra: dict[str, Any] = {"mode": sk.ClearMode.EMPTY}
    model(torch.randn(2, 4))
    sk.clear_state(model[1], **extra)
    assert model[1].act is None
