"""What must match before ``load`` applies anything: keys, shapes, dtypes, RNG layout, and
how strictly (:class:`Strict`). Pure checks: nothing is loaded here."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import Any

import torch

from statekeeper.state.modules import unwrap
from statekeeper.state.rng import RNGState

__all__ = ["Strict", "check_state"]


class Strict(StrEnum):
    """Which key mismatches ``load`` tolerates. Shape and dtype mismatches are always errors.

    - ``EXACT``: every key of the live state and of the checkpoint must match (default).
    - ``ALLOW_MISSING``: live keys absent from the checkpoint keep their current values.
    - ``ALLOW_UNEXPECTED``: checkpoint keys with no live counterpart are ignored.
    - ``PARTIAL``: both of the above.
    """

    EXACT = "exact"
    ALLOW_MISSING = "allow_missing"
    ALLOW_UNEXPECTED = "allow_unexpected"
    PARTIAL = "partial"

    @property
    def missing_ok(self) -> bool:
        return self in (Strict.ALLOW_MISSING, Strict.PARTIAL)

    @property
    def unexpected_ok(self) -> bool:
        return self in (Strict.ALLOW_UNEXPECTED, Strict.PARTIAL)


def _check_tensor(where: str, saved: Any, live: Any, problems: list[str]) -> None:
    if isinstance(live, torch.Tensor) and isinstance(saved, torch.Tensor):
        if saved.shape != live.shape:
            problems.append(
                f"{where}: shape {tuple(saved.shape)} in checkpoint, {tuple(live.shape)} live"
            )
        elif saved.dtype != live.dtype:
            problems.append(f"{where}: dtype {saved.dtype} in checkpoint, {live.dtype} live")
    elif isinstance(live, torch.Tensor) != isinstance(saved, torch.Tensor):
        problems.append(
            f"{where}: {type(saved).__name__} in checkpoint, {type(live).__name__} live"
        )


def check_state(
    saved: dict[str, Any],
    state: Mapping[str, Any],
    strict: Strict,
    planned: Collection[str] = (),
) -> list[str]:
    """Every key, shape and dtype mismatch; modules in ``planned`` (whose direct copy plan
    already matched every key, shape and dtype) are not compared again."""
    problems: list[str] = []
    if not strict.missing_ok:
        problems += [f"{n}: missing from the checkpoint" for n in state if n not in saved]
    if not strict.unexpected_ok:
        problems += [
            f"{n}: in the checkpoint but not in the live state" for n in saved if n not in state
        ]
    for name, obj in state.items():
        if name not in saved or name in planned:
            continue
        if isinstance(obj, torch.nn.Module):
            live_sd = unwrap(obj).state_dict()
            saved_sd = saved[name]
            if not isinstance(saved_sd, Mapping):
                problems.append(
                    f"{name}: checkpoint holds a {type(saved_sd).__name__}, not a state_dict"
                )
                continue
            if not strict.missing_ok:
                derivable = _derivable_keys(unwrap(obj))
                problems += [
                    f"{name}/{k}: missing from the checkpoint"
                    for k in live_sd
                    if k not in saved_sd and k not in derivable
                ]
            if not strict.unexpected_ok:
                problems += [
                    f"{name}/{k}: unexpected (not in the live module)"
                    for k in saved_sd
                    if k not in live_sd
                ]
            for k in live_sd.keys() & saved_sd.keys():
                _check_tensor(f"{name}/{k}", saved_sd[k], live_sd[k], problems)
        elif isinstance(obj, torch.Tensor):
            _check_tensor(name, saved[name], obj, problems)
        elif isinstance(obj, RNGState):
            problems += obj.mismatches(saved[name], name)
    return problems


def _derivable_keys(module: torch.nn.Module) -> set[str]:
    """Keys that submodules derive when a checkpoint lacks them (``statekeeper_derivable_keys``
    on the module's class, e.g. ``AveragedModel``'s ``n_calls`` for torch's layout)."""
    return {
        f"{prefix}.{key}" if prefix else key
        for prefix, sub in module.named_modules()
        for key in getattr(sub, "statekeeper_derivable_keys", ())
    }
