"""The reused save plan: the same bytes as a full prepare, and never reused when stale."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

import statekeeper as sk
from statekeeper.checkpoint.plan_cache import PlanCache
from statekeeper.checkpoint.save import capture
from statekeeper.checkpoint.writer import prepare


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4)
        self.out = torch.nn.Linear(4, 8, bias=False)
        self.out.weight = self.emb.weight  # tied
        self.register_buffer("head", self.emb.weight.detach()[:4])  # a view of it


def _same(a: Any, b: Any) -> None:
    assert a.skeleton == b.skeleton
    assert a.aliases == b.aliases
    assert list(a.stored) == list(b.stored)
    for name, t in a.stored.items():
        other = b.stored[name]
        assert t.data_ptr() == other.data_ptr() and t.shape == other.shape, name
        assert t.stride() == other.stride() and t.dtype == other.dtype, name


def _state(model: torch.nn.Module, **extra: Any) -> dict[str, Any]:
    return capture({"model": model, "meta": {"lr": 0.1, "step": 3, "flag": True, **extra}})


def test_a_repeated_state_reuses_the_plan_and_matches_a_full_prepare() -> None:
    cache = PlanCache()
    model = Tied()
    first = prepare(_state(model), cache=cache)
    second = prepare(_state(model), cache=cache)
    assert first.plan is not None and second.plan is first.plan
    _same(second, prepare(_state(model)))
    assert second.aliases  # the tied weight and the view are aliases
    assert all(second.stored[n] is not first.stored[n] for n in second.stored)  # new objects


@pytest.mark.parametrize(
    "change",
    [
        {"lr": 0.2},
        {"lr": -0.0},
        {"step": 3.0},
        {"flag": 1},
        {"step": True},
        {"extra": None},
        {"lr": (0.1,)},
        {"lr": [0.1]},
    ],
)
def test_any_change_of_a_plain_value_is_a_miss(change: dict[str, Any]) -> None:
    cache = PlanCache()
    model = Tied()
    first = prepare(_state(model), cache=cache)
    changed = _state(model, **change)
    again = prepare(changed, cache=cache)
    assert again.plan is not first.plan
    _same(again, prepare(changed))


def test_new_memory_new_shapes_or_new_sharing_is_a_miss() -> None:
    cache = PlanCache()
    model = Tied()
    base = prepare(_state(model), cache=cache)
    with torch.no_grad():
        model.out.weight = torch.nn.Parameter(model.emb.weight.clone())  # untied
    untied = prepare(_state(model), cache=cache)
    assert untied.plan is not base.plan and "model/out.weight" in untied.stored
    _same(untied, prepare(_state(model)))
    model.head = model.emb.weight.detach()[1:5]  # the view moves within the storage
    moved = prepare(_state(model), cache=cache)
    assert moved.plan is not untied.plan
    _same(moved, prepare(_state(model)))
    model.head = torch.zeros(3, 4)  # a new shape, its own memory
    reshaped = prepare(_state(model), cache=cache)
    assert reshaped.plan is not moved.plan
    _same(reshaped, prepare(_state(model)))


def test_states_it_cannot_describe_exactly_are_never_cached() -> None:
    cache = PlanCache()
    weight = torch.arange(8.0)
    odd: list[dict[str, Any]] = [
        {"x": weight, "k": {1: "int key"}},
        {"x": weight, "n": torch.zeros(2).numpy()},
        {"x": weight, "v": weight.view(torch.int32)},  # a re-typed view is copied
        {"x": weight, "o": OrderedDict(a=1)},  # plain OrderedDict: cached (control)
    ]
    plans = [prepare(s, cache=cache).plan for s in odd]
    assert plans[:3] == [None, None, None]
    assert plans[3] is not None


def test_async_saves_of_a_reused_plan_hold_the_right_values(tmp_path: Path) -> None:
    model = Tied()
    counter = {"seen": 0}
    for step in (1, 2, 3):
        with torch.no_grad():
            model.emb.weight.fill_(float(step))
        counter["seen"] = step
        pending = sk.save(tmp_path, {"model": model, "counter": counter}, step=step, blocking=False)
        with torch.no_grad():
            model.emb.weight.fill_(-1.0)  # after the call returns: not in the snapshot
        pending.wait()
    sk.save(tmp_path, {"model": model}, step=9, blocking=False).wait()
    for step in (1, 2, 3):
        state = sk.read(tmp_path, step=step)
        assert state["counter"] == {"seen": step}
        weight = state["model"]["emb.weight"]
        assert torch.equal(weight, torch.full((8, 4), float(step)))
        assert state["model"]["out.weight"].data_ptr() == weight.data_ptr()  # tied again
        assert torch.equal(state["model"]["head"], weight[:4])


def test_an_entry_that_changes_every_save_does_not_replan_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from statekeeper.checkpoint import plan_cache

    model = Tied()
    full = plan_cache._full
    planned: list[list[str]] = []

    def counting(captured: dict[str, Any]) -> Any:
        planned.append(list(captured))
        return full(captured)

    monkeypatch.setattr(plan_cache, "_full", counting)
    cache = PlanCache()
    for _ in range(2):
        state = {"model": model.state_dict(), "rng": sk.RNGState().state_dict(), "step": 3}
        prepared = prepare(state, cache=cache)
        reference = prepare(state)
        assert prepared.skeleton == reference.skeleton
        assert list(prepared.stored) == list(reference.stored)
        assert prepared.aliases == reference.aliases
    assert planned.count(["model"]) == 1  # planned once, then reused
    assert planned.count(["rng"]) == 2  # numpy's state: never cached


def test_entries_that_share_memory_are_planned_together() -> None:
    weight = torch.arange(12.0).reshape(3, 4)
    state = {"a": {"w": weight}, "b": {"v": weight[1:]}, "c": {"w": weight}}
    cached = prepare(state, cache=PlanCache())
    reference = prepare(state)
    assert cached.aliases == reference.aliases and list(cached.stored) == list(reference.stored)
    assert "c/w" in cached.aliases  # stored once across entries
