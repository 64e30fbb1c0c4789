"""SK006: state that the state_dict does not capture.

Seen by a transplant: instance A is built with every RNG seeded 1, instance B with every RNG
seeded 2; each runs the same train-mode forward (so lazily built state exists) and is put
in eval mode, then B loads A's state_dict. Both compute the example input in eval mode under
``no_grad`` with the same seed, so randomness in the forward is equal. If the outputs differ,
A holds state its state_dict leaves out: a restored run would compute something else. The
attributes that differ between A and B (tensors, numbers, lists of them, generators) that
are neither parameters nor buffers are named as the probable culprits. If the same state
gives different outputs under the same seed, the output is nondeterministic and the rule
says so instead. Every RNG the factory or the forwards draw from is restored afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import RUNS_MODEL, DoctorRule
from statekeeper.doctor.rules._probe import (
    isolated_rng,
    not_fresh,
    plain_attributes,
    seed_all,
    state_ids,
)
from statekeeper.state.compare import NUMERIC, Leaves, first_difference, leaves

__all__ = ["UncapturedState"]

_CALL_SEED = 3
_MAX_SUSPECTS = 8


def _differ(a: Leaves, b: Leaves) -> tuple[str, Any, Any] | None:
    """The first leaf at which two outputs (or attribute values) differ as numbers."""
    return first_difference(a, b, NUMERIC)


def _stateish(value: Any, depth: int = 0) -> bool:
    """Tensors, generators, numbers, arrays, and lists/tuples/dicts of them."""
    if isinstance(value, torch.Tensor | torch.Generator | int | float | complex | np.ndarray):
        return True
    if isinstance(value, np.generic):
        return True
    if depth < 3 and isinstance(value, list | tuple | dict) and value:
        items = value.values() if isinstance(value, dict) else value
        return all(_stateish(v, depth + 1) for v in items)
    return False


def _suspects(a: torch.nn.Module, b: torch.nn.Module) -> list[str]:
    """Attributes (not parameters or buffers) whose values differ between A and B."""
    owned = state_ids(a)
    others = dict(b.named_modules())
    found: list[str] = []
    for path, attr, value in plain_attributes(a):
        twin = others.get(path)
        if twin is None or id(value) in owned or not _stateish(value):
            continue
        missing = object()
        other = vars(twin).get(attr, missing)
        if other is missing or _differ(list(leaves(value, "")), list(leaves(other, ""))):
            found.append(f"{path}.{attr}" if path else attr)
    return found


class UncapturedState(DoctorRule, id="SK006", severity=Severity.ERROR, needs=RUNS_MODEL):
    summary = "state the state_dict does not capture"

    def check(self, target: Target) -> Iterator[Finding]:
        with isolated_rng():
            seed_all(1)
            feed = target.fresh()
            seed_all(2)
            a, b = feed.model, target.fresh().model
            if a is None or b is None or a is b or target.model in (a, b) or _shared(a, b):
                yield not_fresh(self.id)
                return
            self._warm_up(feed, a)
            self._warm_up(feed, b)
            try:
                b.load_state_dict(a.state_dict())
            except Exception as exc:  # any failure to load is worth reporting, not raising
                yield Finding(
                    self.id, Severity.WARNING, "model",
                    f"skipped: a fresh instance cannot load the state_dict of another: {exc}",
                    "make the state_dict's keys and shapes independent of the seed",
                )  # fmt: skip
                return
            try:
                twin: torch.nn.Module | None = copy.deepcopy(a)
            except Exception:  # not every module can be copied: call A itself again instead
                twin = None
            out_a = self._outputs(feed, a)
            diff = _differ(out_a, self._outputs(feed, b))
            if diff is None:
                return
            again = self._outputs(feed, twin if twin is not None else a)
            if _differ(out_a, again) is not None:
                yield Finding(
                    self.id, Severity.WARNING, "model",
                    "skipped: the output is nondeterministic (the same state and seed give "
                    "different outputs), so a transplant of the state_dict cannot be checked",
                    "draw randomness from torch's, python's or numpy's seeded generators, or "
                    "enable deterministic kernels (torch.use_deterministic_algorithms(True))",
                )  # fmt: skip
                return
            suspects = _suspects(a, b)
        yield self._finding(diff, suspects)

    @staticmethod
    def _warm_up(feed: Target, model: torch.nn.Module) -> None:
        """One train-mode forward (so lazily built state exists), then eval mode."""
        seed_all(_CALL_SEED)
        try:
            with torch.no_grad():
                feed.call(model.train())
        except Exception:  # e.g. BatchNorm on a batch of one: build lazy state in eval instead
            seed_all(_CALL_SEED)
            with torch.no_grad():
                feed.call(model.eval())
        model.eval()

    @staticmethod
    def _outputs(feed: Target, model: torch.nn.Module) -> Leaves:
        """Every leaf of the output, wherever it sits (tuples, dicts, dataclasses, model
        outputs, cache objects): two outputs are equal when their tensors are."""
        seed_all(_CALL_SEED)
        with torch.no_grad():
            return list(leaves(feed.call(model)))

    def _finding(self, diff: tuple[str, Any, Any], suspects: list[str]) -> Finding:
        path, va, vb = diff
        detail, shape = "", None
        if isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor):
            shape = tuple(va.shape)
            if va.shape != vb.shape:
                detail = f" (shape {tuple(va.shape)} vs {tuple(vb.shape)})"
            elif va.is_floating_point() and vb.dtype == va.dtype and va.numel():
                delta = (va.double() - vb.double()).abs().nan_to_num(nan=float("inf")).max()
                detail = f" (max abs difference {delta.item():.3g})"
        if suspects:
            listed = ", ".join(suspects[:_MAX_SUSPECTS])
            more = len(suspects) - _MAX_SUSPECTS
            listed += f" and {more} more" if more > 0 else ""
            culprit = f"probably held by {listed} (neither parameters nor buffers)"
        else:
            culprit = (
                "no module attribute differs: look for state outside the modules "
                "(globals, closures, hooks, objects the forward reads)"
            )
        return Finding(
            self.id, self.severity, "model",
            f"a fresh instance built with another seed and loaded with this model's state_dict "
            f"computes a different {path}{detail} in eval mode: the state_dict does not "
            f"capture everything the output depends on, so a restored run computes something "
            f"else; {culprit}",
            "register such state as buffers (register_buffer) or parameters, or implement "
            "get_extra_state/set_extra_state for state that is not a tensor",
            tensor=path, shape=shape,
        )  # fmt: skip


def _shared(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether the two instances share a parameter or buffer (the factory reuses objects)."""
    return bool(state_ids(a) & state_ids(b))
