"""What must match before ``load`` applies anything: keys, shapes, dtypes, RNG layout, and
how strictly (:class:`Strict`). Pure checks: nothing is loaded here."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import Any

import torch

__all__ = ["Strict", "entry_problems", "module_problems", "tensor_problems"]


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


def tensor_problems(where: str, saved: Any, live: Any) -> list[str]:
    """Why the checkpoint's ``saved`` cannot be copied into the live tensor ``live``."""
    if isinstance(live, torch.Tensor) and isinstance(saved, torch.Tensor):
        if saved.shape != live.shape:
            return [f"{where}: shape {tuple(saved.shape)} in checkpoint, {tuple(live.shape)} live"]
        if saved.dtype != live.dtype:
            return [f"{where}: dtype {saved.dtype} in checkpoint, {live.dtype} live"]
    elif isinstance(live, torch.Tensor) != isinstance(saved, torch.Tensor):
        return [f"{where}: {type(saved).__name__} in checkpoint, {type(live).__name__} live"]
    return []


def entry_problems(saved: Collection[str], state: Collection[str], strict: Strict) -> list[str]:
    """The entries missing from the checkpoint or from the live state, as ``strict`` allows."""
    problems: list[str] = []
    if not strict.missing_ok:
        problems += [f"{n}: missing from the checkpoint" for n in state if n not in saved]
    if not strict.unexpected_ok:
        problems += [
            f"{n}: in the checkpoint but not in the live state" for n in saved if n not in state
        ]
    return problems


def module_problems(name: str, module: torch.nn.Module, saved: Any, strict: Strict) -> list[str]:
    """Every key, shape and dtype mismatch between a module and its saved state_dict."""
    if not isinstance(saved, Mapping):
        return [f"{name}: checkpoint holds a {type(saved).__name__}, not a state_dict"]
    live = module.state_dict()
    problems: list[str] = []
    if not strict.missing_ok:
        derivable = _derivable_keys(module)
        problems += [
            f"{name}/{k}: missing from the checkpoint"
            for k in live
            if k not in saved and k not in derivable
        ]
    if not strict.unexpected_ok:
        problems += [
            f"{name}/{k}: unexpected (not in the live module)" for k in saved if k not in live
        ]
    for k in live.keys() & saved.keys():
        problems += tensor_problems(f"{name}/{k}", saved[k], live[k])
    return problems


def _derivable_keys(module: torch.nn.Module) -> set[str]:
    """Keys that submodules derive when a checkpoint lacks them (``statekeeper_derivable_keys``
    on the module's class, e.g. ``AveragedModel``'s ``n_calls`` for torch's layout)."""
    return {
        f"{prefix}.{key}" if prefix else key
        for prefix, sub in module.named_modules()
        for key in getattr(sub, "statekeeper_derivable_keys", ())
    }
