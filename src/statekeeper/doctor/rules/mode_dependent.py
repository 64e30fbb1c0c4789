"""SK009: state that depends on train/eval mode.

On a fresh instance from the factory, the ``state_dict()`` keys and persistent buffer values
are taken in ``train()``, after ``eval()`` and after ``train()`` again; with an example
input, also after an eval-mode forward under ``no_grad`` (caches are often built in the
first eval forward) and after switching back to ``train()``. A key that appears or vanishes
with the mode, or a persistent buffer whose value changes on a mode switch alone, is
reported: a checkpoint saved in one mode fails to load strictly, or loads a stale cache, in
the other. Every RNG the factory or the forward may draw from and every module's mode are
restored afterwards.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Need, Target

__all__ = ["ModeDependent"]

_FIX = (
    "register the cache with persistent=False (or keep it out of the state_dict), and "
    "register every persistent key in __init__, independent of the mode"
)


@dataclass(frozen=True)
class _Snapshot:
    label: str
    keys: tuple[str, ...]
    buffers: dict[str, torch.Tensor]


def _snapshot(model: torch.nn.Module, label: str) -> _Snapshot:
    state = model.state_dict(keep_vars=True)
    buffer_ids = {id(b) for b in model.buffers()}
    buffers = {
        k: v.detach().clone()
        for k, v in state.items()
        if isinstance(v, torch.Tensor) and id(v) in buffer_ids
    }
    return _Snapshot(label, tuple(state), buffers)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    return bool(
        (a.is_floating_point() or a.is_complex())
        and torch.equal(a.isnan(), b.isnan())
        and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
    )


@contextmanager
def _preserved(model: torch.nn.Module | None) -> Iterator[None]:
    """Restores the RNGs (torch CPU, python, numpy) and the modes of ``model``'s modules."""
    modes = [(m, m.training) for m in model.modules()] if model is not None else []
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        for module, training in modes:
            module.training = training


class ModeDependent:
    id = "SK009"
    summary = "state_dict keys or buffer values that depend on train/eval mode"
    severity = Severity.ERROR
    needs: frozenset[Need] = frozenset({Need.MODEL, Need.FACTORY})

    def check(self, target: Target) -> Iterator[Finding]:
        with _preserved(None):  # the factory and the forward may draw random numbers
            fresh = target.fresh()
            model = fresh.model
            if model is None:
                return
            with _preserved(model):
                snaps = self._snapshots(model, fresh if fresh.has(Need.INPUT) else None)
        yield from self._compare(snaps)

    def _snapshots(self, model: torch.nn.Module, fresh: Target | None) -> list[_Snapshot]:
        model.train()
        snaps = [_snapshot(model, "train()")]
        model.eval()
        snaps.append(_snapshot(model, "eval()"))
        model.train()
        snaps.append(_snapshot(model, "train()"))
        if fresh is not None:
            model.eval()
            with torch.no_grad():
                fresh.call(model)
            snaps.append(_snapshot(model, "an eval() forward"))
            model.train()
            snaps.append(_snapshot(model, "train()"))
        return snaps

    def _compare(self, snaps: list[_Snapshot]) -> Iterator[Finding]:
        reported: set[str] = set()
        for before, after in pairwise(snaps):
            if after.label == "an eval() forward":
                continue  # a forward may change state for other reasons (SK005)
            changes = [(k, "appears") for k in after.keys if k not in before.keys]
            changes += [(k, "vanishes") for k in before.keys if k not in after.keys]
            changes += [
                (k, "changes value")
                for k in after.buffers
                if k in before.buffers and not _same(before.buffers[k], after.buffers[k])
            ]
            for key, what in changes:
                if key in reported:
                    continue
                reported.add(key)
                t = after.buffers.get(key, before.buffers.get(key))
                yield Finding(
                    self.id, Severity.ERROR, key.rpartition(".")[0] or "<root>",
                    f"{key!r} {what} when {before.label} is followed by {after.label}: a "
                    "checkpoint saved in one mode fails to load strictly, or loads a stale "
                    "cache, in the other",
                    _FIX, tensor=key,
                    shape=None if t is None else tuple(t.shape),
                    bytes=None if t is None else t.numel() * t.element_size(),
                )  # fmt: skip
