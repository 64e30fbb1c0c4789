"""clear_state: the Torch7 clearState cases re-made in PyTorch (cached output with an outside
reference, identity-like module, narrow/view, a module shared twice, custom rules, a
recurrent and a spiking layer's state, a hook's activations), and what a generic clearing
must never do (touch a parameter, a buffer or their bookkeeping, drop a constant of
__init__, empty a tensor that is not the module's)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import statekeeper as sk


class Caching(torch.nn.Module):
    """Keeps its last output, as Torch7 modules kept ``self.output``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.output: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.output = self.linear(x)
        return self.output


class Identity(torch.nn.Module):
    """Identity-like: its cached output *is* its input."""

    def __init__(self) -> None:
        super().__init__()
        self.output: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.output = x
        return x


class Borrowing(Identity):
    statekeeper_borrowed = ("output",)


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


class Spiking(torch.nn.Module):
    """A leaky integrate-and-fire layer: the membrane potential starts as the float 0.0 and
    is a tensor once a forward ran (spikes are computed without autograd history)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.v: float | torch.Tensor = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.v = 0.9 * self.v + self.fc(x)
            spikes = (self.v > 1.0).float()
            self.v = self.v * (1.0 - spikes)
        return spikes


class BufferedMembrane(torch.nn.Module):
    """Membrane potential in a persistent buffer whose shape follows the batch (SK005)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.register_buffer("v", torch.zeros(1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.v * 0.9 + self.fc(self.norm(x)).detach()
        self.v = v
        return v


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _untouched(before: dict[str, torch.Tensor], model: torch.nn.Module) -> bool:
    after = model.state_dict()
    return list(before) == list(after) and all(
        before[k].dtype == after[k].dtype and torch.equal(before[k], after[k]) for k in before
    )


def test_a_cached_output_is_emptied_in_place_and_an_outside_reference_sees_it() -> None:
    model = Caching()
    returned = model(torch.randn(2, 4))
    outside = model.output
    before = _weights(model)
    report = sk.clearing.ClearReport()
    assert sk.clearing.clear_state(model, report=report) is model
    assert outside is returned and outside.numel() == 0  # the same object, now empty
    assert outside.dtype == torch.float32 and model.output is None
    assert report.cleared == [sk.clearing.Cleared("output", sk.clearing.ClearAction.EMPTIED, 32)]
    assert report.bytes == 32 and _untouched(before, model)


def test_release_mode_only_drops_references_and_a_pending_backward_runs() -> None:
    model = Caching()
    loss = (model(torch.randn(2, 4)) ** 2).sum()  # the graph saved the output
    kept = model.output
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, mode=sk.clearing.ClearMode.RELEASE, report=report)
    loss.backward()
    assert model.output is None and kept is not None and kept.shape == (2, 4)
    assert report.cleared == [sk.clearing.Cleared("output", sk.clearing.ClearAction.RELEASED, 32)]
    # in the default mode a graph that saved the emptied output cannot run: torch says so
    loss = (model(torch.randn(2, 4)) ** 2).sum()
    sk.clearing.clear_state(model)
    with pytest.raises(RuntimeError, match="inplace operation"):
        loss.backward()
    with pytest.raises(sk.errors.InvalidArgumentError, match=r"mode='free'.*'empty', 'release'"):
        sk.clearing.clear_state(model, mode="free")
    with pytest.raises(sk.errors.InvalidArgumentError, match="include='buffers'"):
        sk.clearing.clear_state(model, include="buffers")


def test_an_identity_like_modules_input_survives() -> None:
    x = torch.randn(2, 4)
    kept = x.clone()
    model = torch.nn.Sequential(Identity(), Caching())
    model(x)
    sk.clearing.clear_state(model)
    assert torch.equal(x, kept)  # no history, undeclared: maybe an input, never emptied
    assert model[1].output is None
    w = torch.randn(4, 4, requires_grad=True)
    feats = torch.randn(2, 4) @ w  # the caller's, with autograd history not of the model
    kept = feats.detach().clone()
    head = torch.nn.Sequential(Identity(), torch.nn.Linear(4, 2))
    head(feats)
    sk.clearing.clear_state(head)
    assert torch.equal(feats, kept) and head[0].output is None
    x = torch.randn(2, 4, requires_grad=True) * 2
    borrowing = Borrowing()
    borrowing(x)
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(borrowing, report=report)
    assert x.shape == (2, 4) and borrowing.output is None
    assert report.cleared == [sk.clearing.Cleared("output", sk.clearing.ClearAction.RELEASED, 32)]
    chain = torch.nn.Sequential(Caching(), Identity())  # the same object twice: one tensor
    out = chain(torch.randn(2, 4))
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(chain, report=report)
    assert out.numel() == 0 and chain[0].output is None and chain[1].output is None
    assert report.bytes == 32  # one tensor, counted once


def test_a_narrow_view_is_dropped_and_its_base_keeps_its_data_until_emptied() -> None:
    class Narrow(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.output: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.output = x.narrow(1, 0, 2)
            return self.output

    model = torch.nn.Sequential(Caching(), Narrow())
    view = model(torch.randn(2, 4))
    base = model[0].output
    data = view.detach().clone()
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, report=report)
    assert base is not None and base.numel() == 0  # the base: the caching module's own
    assert torch.equal(view, data)  # the view was dropped by reference, never emptied
    actions = {c.path: c.action for c in report.cleared}
    assert actions == {
        "0.output": sk.clearing.ClearAction.EMPTIED,
        "1.output": sk.clearing.ClearAction.RELEASED,
    }


def test_views_and_other_models_parameters_survive() -> None:
    teacher = torch.nn.Linear(4, 4)
    weight = teacher.weight.detach().clone()

    class Holder(torch.nn.Module):
        statekeeper_transient = ("refs", "first", "alias")

        def __init__(self) -> None:
            super().__init__()
            self.refs: list[torch.Tensor] = []
            self.first: torch.Tensor | None = None
            self.alias: torch.Tensor | None = None
            self.register_buffer("scale", torch.ones(3))

    model = Holder()
    model.refs.append(teacher.weight)
    base = torch.randn(3, 4)
    model.first = base[:, :2]
    model.alias = model.scale.detach()  # another tensor on the buffer's storage
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, report=report)
    assert torch.equal(teacher.weight, weight) and base.shape == (3, 4)  # both intact
    assert model.refs == [teacher.weight]  # a parameter (of any model): never touched
    assert model.first is None and model.alias is None  # let go, never emptied
    assert torch.equal(model.scale, torch.ones(3))
    assert [c.action for c in report.cleared] == [sk.clearing.ClearAction.RELEASED] * 2


def test_parameters_bookkeeping_and_constants_are_never_touched() -> None:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 4)
    model = torch.nn.Sequential(lstm)
    x = torch.randn(3, 2, 4)
    expected = lstm(x)[0]
    before = _weights(model)
    sk.clearing.clear_state(model, include=sk.clearing.ClearInclude.BATCH_STATE)
    assert torch.equal(lstm(x)[0], expected) and _untouched(before, model)  # _flat_weights
    rec = Recurrent()
    rec(torch.randn(2, 4))
    sk.clearing.clear_state(rec, like=Recurrent())
    assert rec.mask.shape == (4, 4) and torch.equal(rec.mask, torch.tril(torch.ones(4, 4)))


def test_a_module_shared_twice_is_cleared_once() -> None:
    shared = Caching()
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)
    model(torch.randn(2, 4))
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, report=report)
    assert report.cleared == [sk.clearing.Cleared("0.output", sk.clearing.ClearAction.EMPTIED, 32)]


def test_a_modules_own_rule_replaces_the_generic_one_and_may_call_it() -> None:
    class KeepsAnEmptyOutput(Caching):
        def statekeeper_clear_state(self) -> None:
            sk.clearing.clear_state(self)  # the generic part, then its own construction-time value
            self.output = torch.empty(0)

    class Torch7Named(Caching):
        def clear_state(self) -> None:  # the Torch7 name is honoured too
            self.output = torch.zeros(0)

    class UnrelatedClearState(Caching):
        def clear_state(self, key: str) -> None:  # takes an argument: not a clearing rule
            raise AssertionError("never called")

    class Registered(Caching):
        pass

    calls: list[Any] = []
    sk.clearing.register_clear_rule(Registered, calls.append)
    own, named, unrelated, registered = (
        KeepsAnEmptyOutput(), Torch7Named(), UnrelatedClearState(), Registered()
    )  # fmt: skip
    for m in (own, named, unrelated, registered):
        m(torch.randn(1, 4))
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(torch.nn.ModuleList([own, named, unrelated, registered]), report=report)
    assert own.output is not None and own.output.numel() == 0
    assert named.output is not None and named.output.dtype == torch.float32
    assert unrelated.output is None  # cleared generically
    assert calls == [registered] and registered.output is not None  # the rule decided
    assert [c.path for c in report.cleared if c.action is sk.clearing.ClearAction.CUSTOM] == [
        "0", "1", "3"
    ]  # fmt: skip
    with pytest.raises(sk.errors.InvalidArgumentError, match="register_clear_rule"):
        sk.clearing.register_clear_rule("Caching", calls.append)

    class Static(torch.nn.Module):
        statekeeper_clear_state = staticmethod(lambda: None)

    with pytest.raises(sk.errors.InvalidArgumentError, match="plain method"):
        sk.clearing.clear_state(Static())


def test_a_rule_asking_for_the_generic_part_does_not_clear_its_children_twice() -> None:
    calls: list[str] = []

    class Child(Caching):
        def statekeeper_clear_state(self) -> None:
            calls.append("child")

    class Parent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.child = Child()
            self.seen: torch.Tensor | None = None

        def statekeeper_clear_state(self) -> None:
            calls.append("parent")
            sk.clearing.clear_state(self)  # inherits the outer call's mode and fresh instance

    parent = Parent()
    with torch.no_grad():
        parent.seen = torch.ones(3)  # no history: only the fresh instance shows it
    sk.clearing.clear_state(parent, mode=sk.clearing.ClearMode.RELEASE, like=Parent())
    assert calls == ["parent", "child"] and parent.seen is None


def test_a_recurrent_hidden_state_is_cleared_and_the_next_forward_is_a_fresh_models() -> None:
    torch.manual_seed(0)
    model = Recurrent()
    fresh = Recurrent()
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(2, 4)
    model(x)
    last = model(x)  # the hidden state carries the last two steps (and their graph)
    assert not torch.equal(model(x), fresh(x))
    sk.clearing.clear_state(fresh)
    sk.clearing.clear_state(model)
    assert model.hidden is None and last.numel() == 2 * 4  # an earlier step's: not held
    assert torch.equal(model(x), fresh(x))


def test_a_spiking_layers_membrane_is_reset_to_what_init_left() -> None:
    torch.manual_seed(0)
    model = Spiking()
    fresh = Spiking()
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(2, 4) * 3
    for _ in range(3):
        model(x)
    assert isinstance(model.v, torch.Tensor)
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, report=report)  # no history, undeclared: cannot tell, left alone
    assert report.cleared == [] and isinstance(model.v, torch.Tensor)
    sk.clearing.clear_state(model, like=Spiking(), report=report)
    assert model.v == 0.0 and report.cleared == [
        sk.clearing.Cleared("v", sk.clearing.ClearAction.RELEASED, 32)
    ]
    assert torch.equal(model(x), fresh(x)) and torch.equal(model(x), fresh(x))


def test_per_batch_buffers_are_reset_only_when_asked_and_running_statistics_stay() -> None:
    torch.manual_seed(0)
    model = BufferedMembrane()
    fresh = BufferedMembrane()
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(3, 4)
    model(x)
    stats = model.norm.running_mean.clone()
    v = model.v
    sk.clearing.clear_state(model)
    assert model.v is v and v.shape == (3, 4)  # buffers only with include=
    report = sk.clearing.ClearReport()
    batch = sk.clearing.ClearInclude.BATCH_STATE
    sk.clearing.clear_state(model, include=batch, like=BufferedMembrane(), report=report)
    assert model.v is v and torch.equal(v, torch.zeros(1, 4))  # in place, as __init__ left it
    assert torch.equal(model.norm.running_mean, stats)  # running statistics: never touched
    assert report.cleared == [sk.clearing.Cleared("v", sk.clearing.ClearAction.RESET, 3 * 4 * 4)]
    model.norm.load_state_dict(fresh.norm.state_dict())
    assert torch.equal(model(x), fresh(x))

    class Declared(BufferedMembrane):
        statekeeper_batch_state = ("v",)

    declared = Declared()
    declared(x)
    sk.clearing.clear_state(declared, include="batch_state")  # zeros without a fresh instance
    assert torch.equal(declared.v, torch.zeros(3, 4))

    class Wrong(BufferedMembrane):
        statekeeper_batch_state = ("v", "weight")

    wrong = Wrong()
    wrong.register_parameter("weight", torch.nn.Parameter(torch.ones(1)))
    with pytest.raises(sk.errors.InvalidArgumentError, match="parameter 'weight'"):
        sk.clearing.clear_state(wrong, include=sk.clearing.ClearInclude.BATCH_STATE)


def test_like_finds_what_a_no_grad_forward_left_and_restores_init_values() -> None:
    class Torch7Style(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.output = torch.empty(0)
            self.table = torch.arange(4.0)  # a constant: equal on the fresh instance

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.output = self.fc(x) + self.table
            self.extra = [self.output * 2]  # created by the forward, not by __init__
            return self.output

    model = Torch7Style()
    with torch.no_grad():
        out = model(torch.randn(2, 4))
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, like=Torch7Style(), report=report)
    assert isinstance(model.output, torch.Tensor) and model.output.numel() == 0
    assert not hasattr(model, "extra") and torch.equal(model.table, torch.arange(4.0))
    assert out.shape == (2, 4)  # no history, undeclared: dropped, never emptied
    assert sorted(c.path for c in report.cleared) == ["extra", "output"]
    with pytest.raises(
        sk.errors.InvalidArgumentError, match=r"Torch7Style at 'the root'.*Identity"
    ):
        sk.clearing.clear_state(model, like=Identity())
    with pytest.raises(sk.errors.InvalidArgumentError, match=r"Caching at '0'.*Identity"):
        sk.clearing.clear_state(
            torch.nn.Sequential(Caching()), like=torch.nn.Sequential(Identity())
        )
    with pytest.raises(sk.errors.InvalidArgumentError, match="another object"):
        sk.clearing.clear_state(model, like=model)


def test_activations_kept_by_a_hook_are_freed() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    # (typing) a value of another type, on purpose: what the library does with it is tested
    model.seen = []  # type: ignore[assignment]
    model[0].register_forward_hook(lambda m, i, o: model.seen.append(o))
    outs = [model(torch.randn(2, 4)) for _ in range(2)]
    first = model.seen[0]
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, report=report)
    assert model.seen == [] and first.numel() == 0 and outs[0].shape == (2, 4)
    assert report.cleared == [
        sk.clearing.Cleared("seen", sk.clearing.ClearAction.EMPTIED, 2 * 2 * 4 * 4)
    ]


def test_a_mixed_container_and_a_tuple_state() -> None:
    class Mixed(torch.nn.Module):
        statekeeper_transient = ("conf",)
        statekeeper_owned = ("state", "pair")  # no history, but the module's own: emptied

        def __init__(self) -> None:
            super().__init__()
            self.conf: dict[str, Any] = {"scale": 2.0}
            self.state: tuple[torch.Tensor, torch.Tensor] | None = None

    model = Mixed()
    model.conf["buf"] = torch.ones(2)
    h, c = torch.ones(1), torch.ones(1)
    model.state = (h, c)
    # (typing) a value of another type, on purpose: what the library does with it is tested
    model.pair = (torch.ones(3), None)  # type: ignore[assignment]
    sk.clearing.clear_state(model)
    assert model.conf["scale"] == 2.0  # a container that also holds other values: left
    assert model.state is None and h.numel() == 0 and c.numel() == 0  # owned: emptied
    assert model.pair is None  # tensors and None only: cleared


def test_the_callers_containers_survive_and_release_mode_keeps_their_tensors() -> None:
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
    sk.clearing.clear_state(model, mode=sk.clearing.ClearMode.RELEASE)
    assert list(batch) == ["x"] and xs[0].shape == (2,)  # the caller's: untouched
    assert model.batch == {} and model.last == [] and model.wt.shape == (4, 3)
    model(batch, xs)
    report = sk.clearing.ClearReport()
    sk.clearing.clear_state(model, report=report)  # history, but not the module's graph: dropped
    assert list(batch) == ["x"] and len(xs) == 1 and xs[0].shape == (2,)
    assert {c.action for c in report.cleared} == {sk.clearing.ClearAction.RELEASED}


def test_the_next_forward_after_clearing_equals_a_fresh_models() -> None:
    def build() -> torch.nn.Sequential:
        return torch.nn.Sequential(Caching(), Recurrent(), Spiking(), Identity())

    torch.manual_seed(0)
    model = build()
    fresh = build()
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(2, 4)
    for _ in range(3):
        model(x).sum()
    before = _weights(model)
    sk.clearing.clear_state(model, like=build())
    assert _untouched(before, model)
    assert torch.equal(model(x), fresh(x)) and torch.equal(model(x), fresh(x))
