"""clear_state: the Torch7 clearState cases re-made in PyTorch. Owned transient tensors are
emptied in place (outside references stay the same object), tensors a module does not own
are only dropped, parameters and buffers are never touched, each module is cleared once,
and the next forward equals a fresh model's."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import statekeeper as sk


class Caching(torch.nn.Module):
    """Keeps its last output (and the autograd graph behind it)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.output: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.output = self.linear(x)
        return self.output


class Identity(torch.nn.Module):
    """Caches its input as its output: a tensor it does not own."""

    statekeeper_borrowed = ("output",)

    def __init__(self) -> None:
        super().__init__()
        self.output: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.output = x
        return x


class Narrow(torch.nn.Module):
    """Keeps a view of its input."""

    def __init__(self) -> None:
        super().__init__()
        self.first: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.first = x[:, :2]
        return x


class Recurrent(torch.nn.Module):
    """A recurrent layer's hidden state, carried from one forward to the next."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.Linear(4, 4)
        self.hidden: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros_like(x) if self.hidden is None else self.hidden
        self.hidden = torch.tanh(self.cell(x) + h)
        return self.hidden


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_an_owned_cached_output_is_emptied_in_place() -> None:
    model = Caching()
    model(torch.randn(2, 4)).sum().backward()
    outside = model.output
    assert outside is not None and outside.grad_fn is not None
    before = _params(model)
    report = sk.ClearReport()
    assert sk.clear_state(model, report=report) is model
    assert model.output is None  # back to what __init__ left
    assert outside.numel() == 0 and outside.grad_fn is None  # the same object, emptied
    assert report.cleared == [sk.Cleared("output", sk.ClearAction.EMPTIED, 2 * 4 * 4)]
    assert report.bytes == 32
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_an_identity_like_modules_input_survives() -> None:
    model = torch.nn.Sequential(Identity())
    x = torch.randn(2, 4)
    kept = x.clone()
    model(x)
    report = sk.ClearReport()
    sk.clear_state(model, report=report)
    assert torch.equal(x, kept)  # the caller's tensor, untouched
    assert model[0].output is None
    assert report.cleared == [sk.Cleared("0.output", sk.ClearAction.DROPPED, 0)]


def test_a_second_holder_and_a_view_are_dropped_not_emptied() -> None:
    model = torch.nn.Sequential(Caching(), Identity(), Narrow())
    model(torch.randn(3, 4))
    owner = model[0].output
    view = model[2].first
    report = sk.ClearReport()
    sk.clear_state(model, report=report)
    actions = {c.path: c.action for c in report.cleared}
    assert actions == {
        "0.output": sk.ClearAction.EMPTIED,
        "1.output": sk.ClearAction.DROPPED,
        "2.first": sk.ClearAction.DROPPED,
    }
    assert owner is not None and owner.numel() == 0
    assert view is not None and view.shape == (3, 2)  # a view of the caller's input: kept


def test_a_tensor_aliasing_a_parameter_is_never_emptied() -> None:
    model = Caching()
    model.output = model.linear.weight.detach()  # the weight's storage
    weight = model.linear.weight.detach().clone()
    sk.clear_state(model)
    assert model.output is None and torch.equal(model.linear.weight, weight)


def test_a_module_shared_twice_is_cleared_once() -> None:
    shared = Caching()
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)
    model(torch.randn(2, 4))
    report = sk.ClearReport()
    sk.clear_state(model, report=report)
    assert [c.path for c in report.cleared] == ["0.output"]


def test_a_modules_own_rule_replaces_the_generic_one() -> None:
    class KeepsAnEmptyOutput(Caching):
        def clear_state(self) -> None:  # constructed as an empty tensor, cleared to one
            self.output = torch.empty(0)

    class Registered(Caching):
        pass

    calls: list[Any] = []
    sk.register_clear_rule(Registered, calls.append)
    own, registered = KeepsAnEmptyOutput(), Registered()
    own(torch.randn(1, 4))
    registered(torch.randn(1, 4))
    sk.clear_state(own)
    sk.clear_state(registered)
    assert own.output is not None and own.output.numel() == 0
    assert calls == [registered] and registered.output is not None  # the rule decided
    with pytest.raises(sk.InvalidArgumentError, match="register_clear_rule"):
        sk.register_clear_rule("Caching", calls.append)  # type: ignore[arg-type]


def test_a_recurrent_hidden_state_is_cleared_and_the_next_forward_is_a_fresh_models() -> None:
    torch.manual_seed(0)
    model = Recurrent()
    fresh = Recurrent()
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(2, 4)
    model(x)
    model(x)  # the hidden state now carries the last two steps
    assert not torch.equal(model(x), fresh(x))
    sk.clear_state(model)
    sk.clear_state(fresh)
    assert torch.equal(model(x), fresh(x))


def test_activations_cached_by_a_hook_are_freed() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    model.seen = []  # type: ignore[assignment]
    model[0].register_forward_hook(lambda m, i, o: model.seen.append(o))  # type: ignore[union-attr]
    model(torch.randn(2, 4))
    model(torch.randn(2, 4))
    held = list(model.seen)  # type: ignore[arg-type]
    report = sk.ClearReport()
    sk.clear_state(model, report=report)
    assert model.seen == [] and all(t.numel() == 0 for t in held)
    assert report.cleared == [sk.Cleared("seen", sk.ClearAction.EMPTIED, 2 * 2 * 4 * 4)]
