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

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Need, Target
from statekeeper.doctor.rules._base import BUILDS_MODEL, DoctorRule
from statekeeper.doctor.rules._probe import (
    isolated_rng,
    kept_modes,
    module_path,
    nbytes,
    persistent_buffers,
)
from statekeeper.state.compare import NUMERIC, same

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
    buffers = {k: v.detach().clone() for k, v in persistent_buffers(model).items()}
    return _Snapshot(label, tuple(model.state_dict(keep_vars=True)), buffers)


class ModeDependent(DoctorRule, id="SK009", severity=Severity.ERROR, needs=BUILDS_MODEL):
    summary = "state_dict keys or buffer values that depend on train/eval mode"

    def check(self, target: Target) -> Iterator[Finding]:
        with isolated_rng():  # the factory and the forward may draw random numbers
            fresh = target.fresh()
            model = fresh.model
            if model is None:
                return
            with kept_modes(model):
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
                if k in before.buffers and not same(before.buffers[k], after.buffers[k], NUMERIC)
            ]
            for key, what in changes:
                if key in reported:
                    continue
                reported.add(key)
                t = after.buffers.get(key, before.buffers.get(key))
                yield Finding(
                    self.id, Severity.ERROR, module_path(key, "<root>"),
                    f"{key!r} {what} when {before.label} is followed by {after.label}: a "
                    "checkpoint saved in one mode fails to load strictly, or loads a stale "
                    "cache, in the other",
                    _FIX, tensor=key,
                    shape=None if t is None else tuple(t.shape),
                    bytes=None if t is None else nbytes(t),
                )  # fmt: skip
