"""SK003: a persistent buffer that is a constant derived in ``__init__``.

A table computed in ``__init__`` (positional encodings, masks, frequency grids) and
registered as a persistent buffer is saved in every checkpoint although the code rebuilds
it: it bloats checkpoints, and loading an old checkpoint after the code changed the table
either fails on the shape or silently restores the old values. Seen by building the model
twice under different seeds (every global generator seeded 1, then 2: the buffer is
identical as numbers, and equal to the target's) and running one training step on a fresh
instance (the buffer does not change). BatchNorm's
running statistics change in that step, its ``num_batches_tracked`` is skipped, and buffers
that alias a parameter are left to the rules on shared storage.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

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
    seed_all,
)
from statekeeper.format.aliases import storage_key
from statekeeper.state.compare import NUMERIC, same

__all__ = ["DerivedConstant"]

_SEEDS = (1, 2)


def _persistent_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Floating or integer persistent buffers that are not a parameter's alias."""
    storages = {storage_key(p) for p in model.parameters()} - {None}
    out = {}
    for name, buf in persistent_buffers(model).items():
        if (
            name.rpartition(".")[2] != "num_batches_tracked"
            and (buf.is_floating_point() or (not buf.is_complex() and buf.dtype != torch.bool))
            and buf.numel() > 0
            and buf.device.type != "meta"
            and storage_key(buf) not in storages
        ):
            out[name] = buf
    return out


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, Mapping) else value
    if isinstance(items, list | tuple | type({}.values())):
        for item in items:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _train_step(target: Target, model: torch.nn.Module) -> None:
    """One forward/backward/SGD step in train mode; modes and grad mode restored after."""
    with kept_modes(model):
        model.train()
        with torch.enable_grad():
            out = _first_tensor(target.call(model))
            if out is None:
                return
            loss = out.float().sum()
            params = [p for p in model.parameters() if p.requires_grad]
            if not loss.requires_grad or not params:
                return
            torch.autograd.backward(loss)
            stepped = [p for p in params if p.grad is not None]
            if stepped:
                torch.optim.SGD(stepped, lr=1e-3).step()


def _uniform(t: torch.Tensor) -> bool:
    """All elements equal: how state starts (zeros, ones, a counter), not a derived table."""
    flat = t.detach().reshape(-1)
    return same(flat, flat[:1].expand_as(flat), NUMERIC)


def _finding(name: str, buf: torch.Tensor, evidence: str, fix: str) -> Finding:
    """An SK003 warning on buffer ``name``: identical in fresh builds, then ``evidence``."""
    size = nbytes(buf)
    return Finding(
        DerivedConstant.id,
        Severity.WARNING,
        module_path(name),
        f"persistent buffer '{name}' ({size} bytes) is identical in fresh builds under torch "
        f"seeds {_SEEDS[0]} and {_SEEDS[1]} and {evidence}",
        fix,
        tensor=name,
        shape=tuple(buf.shape),
        bytes=size,
    )


def _unconfirmed(candidates: dict[str, torch.Tensor], constant: list[str]) -> Iterator[Finding]:
    """Without an example input: buffers identical in every fresh build that are not a
    uniform fill (a grid, a table, a mask) are likely constants, reported as unconfirmed."""
    for name in constant:
        buf = candidates[name]
        if _uniform(buf):
            continue
        yield _finding(
            name,
            buf,
            "is no uniform fill: likely a constant rebuilt in __init__, yet saved in every "
            "checkpoint (unconfirmed: with no example input, no training step could show that "
            "it never changes)",
            "if it is rebuilt in __init__, register it with register_buffer("
            f"'{name.rpartition('.')[2]}', tensor, persistent=False); to confirm, return "
            "{'model': model, 'example_input': x} from the factory",
        )


class DerivedConstant(DoctorRule, id="SK003", severity=Severity.WARNING, needs=BUILDS_MODEL):
    summary = "a persistent buffer is a constant rebuilt in __init__: it bloats checkpoints"

    def check(self, target: Target) -> Iterator[Finding]:
        candidates = _persistent_buffers(target.require_model())
        if not candidates:
            return
        builds: list[Target] = []
        with isolated_rng():
            for seed in _SEEDS:
                seed_all(seed)
                builds.append(target.fresh())
        models = [b.model for b in builds if b.model is not None]
        if len(models) != len(builds):
            return
        first, second = (_persistent_buffers(m) for m in models)
        constant = [
            name
            for name, buf in candidates.items()
            if name in first
            and name in second
            and same(buf, first[name], NUMERIC)
            and same(first[name], second[name], NUMERIC)
        ]
        if not constant:
            return
        if not target.has(Need.INPUT):  # no training step to confirm: report the likely ones
            yield from _unconfirmed(candidates, constant)
            return
        before = {name: first[name].detach().clone() for name in constant}
        try:
            with isolated_rng():
                _train_step(builds[0], models[0])
        except Exception as exc:  # the user's forward: any failure makes the rule inconclusive
            yield Finding(
                self.id, Severity.INFO, "model",
                f"inconclusive: {len(constant)} persistent buffer(s) are identical in every fresh "
                f"build, but one training step on a fresh instance failed "
                f"({type(exc).__name__}: {exc}), so they may still be state",
                "check that the example input matches the model's forward",
            )  # fmt: skip
            return
        after = _persistent_buffers(models[0])
        for name in constant:
            if name in after and not same(before[name], after[name], NUMERIC):
                continue
            size = nbytes(candidates[name])
            yield _finding(
                name,
                candidates[name],
                "unchanged by a training step: a constant rebuilt in __init__, yet saved in "
                "every checkpoint; loading an old checkpoint after the code changes it fails or "
                "restores stale values",
                f"register it with register_buffer('{name.rpartition('.')[2]}', tensor, "
                f"persistent=False): it is rebuilt in __init__ and saving it wastes {size} bytes "
                "per checkpoint",
            )
