"""SK004: transient tensors held on a module after forward (cached activations, temporaries).

Seen on a fresh instance from the factory: every submodule's ``__dict__`` is recorded after
``__init__``, one forward runs in train mode with grad enabled and one in eval mode under
``no_grad``, and every tensor attribute (or list, tuple or dict of tensors, one level deep)
that is neither a parameter nor a buffer and that the forward created or replaced is
reported with its size. statekeeper does not save such tensors, but they keep memory (and
possibly an autograd graph) alive between steps and bloat any whole-module pickle or
``deepcopy``. Tensors set in ``__init__`` and left alone by forward are constants, SK003's
business. Every RNG the forward or the factory draws from is restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import RUNS_MODEL, FreshModelRule
from statekeeper.doctor.rules._probe import (
    kept_modes,
    nbytes,
    plain_attributes,
    state_ids,
)
from statekeeper.state.attributes import held_tensors

__all__ = ["TransientTensors"]


@dataclass
class _Held:
    path: str
    attr: str
    kind: str
    shape: tuple[int, ...] | None
    bytes: int
    graph: bool
    phases: list[str]


def _attributes(model: torch.nn.Module) -> dict[tuple[str, str], tuple[Any, list[torch.Tensor]]]:
    """(module path, attribute) -> (the value, its tensors) for every tensor attribute."""
    out: dict[tuple[str, str], tuple[Any, list[torch.Tensor]]] = {}
    for path, attr, value in plain_attributes(model):
        tensors = held_tensors(value)
        if tensors is not None:
            out[path, attr] = (value, tensors)
    return out


def _changed(
    before: dict[tuple[str, str], tuple[Any, list[torch.Tensor]]],
    after: dict[tuple[str, str], tuple[Any, list[torch.Tensor]]],
    owned: set[int],
) -> Iterator[tuple[str, str, Any, list[torch.Tensor]]]:
    """Attributes the forward created or replaced, with their tensors that are not state."""
    for (path, attr), (value, tensors) in after.items():
        old = before.get((path, attr))
        if (
            old is not None
            and old[0] is value
            and len(old[1]) == len(tensors)
            and all(a is b for a, b in zip(old[1], tensors, strict=True))
        ):
            continue
        loose = [t for t in tensors if id(t) not in owned]
        if loose and sum(nbytes(t) for t in loose) > 0:
            yield path, attr, value, loose


class TransientTensors(FreshModelRule, id="SK004", severity=Severity.WARNING, needs=RUNS_MODEL):
    summary = "tensors held on a module after forward"

    def probe(self, fresh: Target, model: torch.nn.Module) -> Iterator[Finding]:
        for h in self._held(fresh, model).values():
            graph = ", with the autograd graph behind it," if h.graph else ""
            yield Finding(
                self.id, self.severity, h.path or "model",
                f"{h.kind} attribute '{h.attr}' is set by forward ({' and '.join(h.phases)} "
                f"mode) and stays on the module{graph} holding memory between steps; it is "
                "neither a parameter nor a buffer, so statekeeper does not save it, but it "
                "bloats any whole-module pickle or deepcopy",
                f"don't keep activations on self (return them), or `del self.{h.attr}` / set it "
                "to None after use; if it is a real cache, "
                f"register_buffer('{h.attr}', ..., persistent=False); or declare it on the "
                f"class, `statekeeper_transient = ('{h.attr}',)`, and call "
                "statekeeper.clearing.clear_state(model) before saving or exporting the whole "
                "module",
                tensor=h.attr, shape=h.shape, bytes=h.bytes, module=h.path,
            )  # fmt: skip

    def _held(self, fresh: Target, model: torch.nn.Module) -> dict[tuple[str, str], _Held]:
        held: dict[tuple[str, str], _Held] = {}
        with kept_modes(model):
            for phase in ("train", "eval"):
                before = _attributes(model)
                model.train(phase == "train")
                grad = torch.enable_grad() if phase == "train" else torch.no_grad()
                try:
                    with grad:
                        fresh.call(model)
                except Exception:  # e.g. BatchNorm on a batch of one: only eval can run
                    if phase == "train":
                        continue
                    raise
                owned = state_ids(model)
                for path, attr, value, loose in _changed(before, _attributes(model), owned):
                    size = sum(nbytes(t) for t in loose)
                    if (path, attr) in held:  # seen in train mode: keep what eval left behind
                        seen = held[path, attr]
                        seen.phases.append(phase)
                        seen.bytes = max(seen.bytes, size)
                        seen.shape = tuple(loose[0].shape) if seen.shape is not None else None
                        continue
                    one = isinstance(value, torch.Tensor)
                    held[path, attr] = _Held(
                        path, attr,
                        "tensor" if one else f"{type(value).__name__}-of-tensors",
                        tuple(loose[0].shape) if one else None,
                        size,
                        any(t.grad_fn is not None for t in loose),
                        [phase],
                    )  # fmt: skip
        return held
