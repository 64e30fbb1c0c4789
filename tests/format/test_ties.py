"""One tie detector (format/aliases.py): statekeeper's saves, the safetensors files that
``convert``/``export`` write and ``diff``'s tied keys agree on what is tied."""

from __future__ import annotations

import torch

from statekeeper.format.aliases import plan_sharing, tie_plan, view_key
from statekeeper.interop import safetensors_files, safetensors_write
from statekeeper.interop.tied import drop_tied


def test_tied_means_the_same_view_of_the_same_memory() -> None:
    w = torch.arange(12.0).reshape(3, 4)
    assert view_key(w) == view_key(w.detach()) == view_key(w.view(3, 4))
    assert view_key(w) != view_key(w[1:])  # a slice: overlaps, not tied
    assert view_key(w) != view_key(w.t())  # other strides
    assert view_key(w) != view_key(w.view(torch.int32))  # another dtype
    assert view_key(w) != view_key(w.clone())  # equal values, other memory
    assert view_key(torch.empty(0)) is None and view_key(torch.empty(3, device="meta")) is None


def test_every_user_finds_the_same_ties() -> None:
    w = torch.randn(4, 4)
    tensors = {"emb": w, "head": w.detach(), "half": w[:2], "own": torch.randn(4, 4)}
    stored, aliases = tie_plan(tensors)
    assert aliases == {"head": "emb"} and list(stored) == ["emb", "half", "own"]
    plan = plan_sharing(dict(tensors))
    assert set(plan.aliases) == {"head", "half"} and plan.aliases["head"].base == "emb"
    assert plan.aliases["head"].offset == 0 and plan.aliases["head"].shape == (4, 4)
    a, b, notes = drop_tied({"emb": w, "head": w}, {"emb": w.clone()}, ("a", "b"))
    assert set(a) == {"emb"} and set(b) == {"emb"} and len(notes) == 1
    assert safetensors_write.tie_plan is tie_plan and safetensors_files.tie_plan is tie_plan


def test_empty_tensors_are_never_tied() -> None:
    empty = {"x": torch.empty(0), "y": torch.empty(0)}
    a, b, notes = drop_tied(empty, {"x": torch.empty(0)}, ("a", "b"))
    assert set(a) == {"x", "y"} and set(b) == {"x"} and notes == []
    stored, aliases = tie_plan({"x": torch.empty(0), "y": torch.empty(0)})
    assert aliases == {} and set(stored) == {"x", "y"}
