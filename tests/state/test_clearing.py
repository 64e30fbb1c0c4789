"""clear_state: the Torch7 clearState cases re-made in PyTorch, and what a generic clearing
must never do (empty a tensor someone else holds, touch a parameter's bookkeeping, drop a
constant of __init__, break a pending backward)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import statekeeper as sk


class Caching(torch.nn.Module):
    """Keeps its last output; owns it Torch7-style (emptied in place when cleared)."""

    statekeeper_owned = ("output",)

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.output: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.output = self.linear(x)
        return self.output


class InputCache(torch.nn.Module):
    """Identity-like: caches its input, a tensor it does not own (declared transient)."""

    statekeeper_transient = ("input",)

    def __init__(self) -> None:
        super().__init__()
        self.input: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.input = x
        return x


class Recurrent(torch.nn.Module):
    """A recurrent layer's hidden state, carried from one forward to the next."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.Linear(4, 4)
        self.mask = torch.tril(torch.ones(4, 4))  # a constant of __init__: never touched
        self.hidden: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros_like(x) if self.hidden is None else self.hidden
        self.hidden = torch.tanh(self.cell(x) + h @ self.mask)
        return self.hidden


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_an_owned_cached_output_is_emptied_in_place() -> None:
    model = Caching()
    with torch.no_grad():
        model(torch.randn(2, 4))
    outside = model.output
    before = _weights(model)
    report = sk.ClearReport()
    assert sk.clear_state(model, report=report) is model
    assert model.output is None and outside is not None and outside.numel() == 0
    assert report.cleared == [sk.Cleared("output", sk.ClearAction.EMPTIED, 32)]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_pending_backward_still_runs_and_an_outside_reference_survives() -> None:
    model = Caching()
    loss = model(torch.randn(2, 4)).sum()
    kept = model.output
    report = sk.ClearReport()
    sk.clear_state(model, report=report)  # before backward: only let go, never emptied
    loss.backward()
    assert model.output is None and kept is not None and kept.shape == (2, 4)
    assert report.cleared == [sk.Cleared("output", sk.ClearAction.RELEASED, 32)]


def test_an_identity_like_modules_input_survives() -> None:
    model = torch.nn.Sequential(InputCache(), Caching())
    x = torch.randn(2, 4)
    kept = x.clone()
    with torch.no_grad():
        model(x)
    sk.clear_state(model)
    assert torch.equal(x, kept) and model[0].input is None


def test_views_and_other_models_parameters_survive() -> None:
    teacher = torch.nn.Linear(4, 4)
    weight = teacher.weight.detach().clone()

    class Holder(torch.nn.Module):
        statekeeper_owned = ("refs", "first")

        def __init__(self) -> None:
            super().__init__()
            self.refs: list[torch.Tensor] = []
            self.first: torch.Tensor | None = None

    model = Holder()
    model.refs.append(teacher.weight)
    base = torch.randn(3, 4)
    model.first = base[:, :2]
    report = sk.ClearReport()
    sk.clear_state(model, report=report)
    assert torch.equal(teacher.weight, weight) and base.shape == (3, 4)  # both intact
    assert model.refs == [teacher.weight]  # a parameter (of any model): never touched
    assert model.first is None  # the view let go; its base is the caller's, untouched
    assert [c.path for c in report.cleared] == ["first"]


def test_parameters_bookkeeping_and_constants_are_never_touched() -> None:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 4)
    model = torch.nn.Sequential(lstm)
    x = torch.randn(3, 2, 4)
    expected = lstm(x)[0]
    sk.clear_state(model)
    assert torch.equal(lstm(x)[0], expected)  # _flat_weights kept
    rec = Recurrent()
    rec(torch.randn(2, 4))
    sk.clear_state(rec)
    assert rec.mask.shape == (4, 4)


def test_a_module_shared_twice_is_cleared_once() -> None:
    shared = Caching()
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)
    with torch.no_grad():
        model(torch.randn(2, 4))
    report = sk.ClearReport()
    sk.clear_state(model, report=report)
    assert [c.path for c in report.cleared] == ["0.output"]


def test_a_modules_own_rule_replaces_the_generic_one_and_may_call_it() -> None:
    class KeepsAnEmptyOutput(Caching):
        def statekeeper_clear_state(self) -> None:
            sk.clear_state(self)  # the generic part, then its own construction-time value
            self.output = torch.empty(0)

    class Registered(Caching):
        pass

    calls: list[Any] = []
    sk.register_clear_rule(Registered, calls.append)
    own, registered = KeepsAnEmptyOutput(), Registered()
    with torch.no_grad():
        own(torch.randn(1, 4))
        registered(torch.randn(1, 4))
    sk.clear_state(own)
    sk.clear_state(registered)
    assert own.output is not None and own.output.numel() == 0
    assert calls == [registered] and registered.output is not None  # the rule decided
    with pytest.raises(sk.InvalidArgumentError, match="register_clear_rule"):
        sk.register_clear_rule("Caching", calls.append)  # type: ignore[arg-type]

    class Static(torch.nn.Module):
        statekeeper_clear_state = staticmethod(lambda: None)

    with pytest.raises(sk.InvalidArgumentError, match="plain method"):
        sk.clear_state(Static())


def test_a_recurrent_hidden_state_is_cleared_and_the_next_forward_is_a_fresh_models() -> None:
    torch.manual_seed(0)
    model = Recurrent()
    fresh = Recurrent()
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(2, 4)
    model(x)
    model(x)  # the hidden state carries the last two steps (and their graph)
    assert not torch.equal(model(x), fresh(x))
    sk.clear_state(model)
    sk.clear_state(fresh)
    assert model.hidden is None
    assert torch.equal(model(x), fresh(x))


def test_activations_kept_by_a_hook_are_let_go() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    model.seen = []  # type: ignore[assignment]
    model[0].register_forward_hook(lambda m, i, o: model.seen.append(o))  # type: ignore[union-attr]
    model(torch.randn(2, 4))
    model(torch.randn(2, 4))
    report = sk.ClearReport()
    sk.clear_state(model, report=report)
    assert model.seen == []
    assert report.cleared == [sk.Cleared("seen", sk.ClearAction.RELEASED, 2 * 2 * 4 * 4)]


def test_a_mixed_container_and_a_tuple_state() -> None:
    class Mixed(torch.nn.Module):
        statekeeper_transient = ("conf", "state")

        def __init__(self) -> None:
            super().__init__()
            self.conf: dict[str, Any] = {"scale": 2.0}
            self.state: tuple[torch.Tensor, torch.Tensor] | None = None

    model = Mixed()
    model.conf["buf"] = torch.ones(2)
    model.state = (torch.ones(1), torch.ones(1))
    sk.clear_state(model)
    assert model.conf["scale"] == 2.0  # a container that also holds other values: left
    assert model.state is None  # an LSTMCell-style (h, c) state: back to None


def test_the_callers_containers_and_tied_views_survive() -> None:
    class Keeps(torch.nn.Module):
        statekeeper_transient = ("batch",)

        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(3, 4)
            self.wt = self.emb.weight.t()  # tied, with autograd history: not transient
            self.batch: dict[str, torch.Tensor] = {}
            self.last: list[torch.Tensor] = []

        def forward(self, batch: dict[str, torch.Tensor], xs: list[torch.Tensor]) -> None:
            self.batch = batch
            self.last = xs

    model = Keeps()
    batch = {"x": torch.ones(2)}
    xs = [torch.ones(2, requires_grad=True) * 2]
    model(batch, xs)
    sk.clear_state(model)
    assert list(batch) == ["x"] and len(xs) == 1  # the caller's containers: untouched
    assert model.batch == {} and model.last == [] and model.wt.shape == (4, 3)


def test_a_rule_asking_for_the_generic_part_does_not_clear_its_children_twice() -> None:
    calls: list[str] = []

    class Child(Caching):
        def statekeeper_clear_state(self) -> None:
            calls.append("child")

    class Parent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.child = Child()

        def statekeeper_clear_state(self) -> None:
            calls.append("parent")
            sk.clear_state(self)

    sk.clear_state(Parent())
    assert calls == ["parent", "child"]
