"""Pieces the framework integrations share: optimizer state keyed by the parameter names of
a module that is not itself in the saved state (its weights are saved by the framework's
own files), an RNG state read now and restored later, when the framework asks, and a data
loader's exact position, for frameworks that save what they are handed."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from statekeeper.data.torchdata import capture_loader, restore_loader
from statekeeper.errors import StateMismatchError
from statekeeper.state.optimizer import parameter_names, to_named, to_positional
from statekeeper.state.rng import RNGState

__all__ = [
    "DeferredRNG",
    "LoaderState",
    "NamedOptimizer",
    "apply_named",
    "named_state",
    "plain_tree",
]

_ENTRY = "model"


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a framework's wrapper (Accelerate's ``.optimizer``)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(inner, torch.optim.Optimizer):
        raise StateMismatchError(
            f"the optimizer is a {type(inner).__name__}, not a torch.optim.Optimizer: its "
            "state cannot be keyed by parameter name"
        )
    return inner


def named_state(optimizer: Any, module: torch.nn.Module) -> dict[str, Any]:
    """``optimizer``'s state keyed by the names of ``module``'s parameters (``model/...``)."""
    return to_named("optimizer", _inner(optimizer), parameter_names({_ENTRY: module}))


def apply_named(
    optimizer: Any, module: torch.nn.Module, saved: Mapping[str, Any], where: Path | str
) -> None:
    """Load name-keyed ``saved`` into ``optimizer``; every mismatch is reported together, and
    nothing is loaded when there is one."""
    inner = _inner(optimizer)
    mapped, problems = to_positional("optimizer", saved, inner, parameter_names({_ENTRY: module}))
    if problems:
        raise StateMismatchError(
            f"{where}: the optimizer state does not fit the live optimizer: "
            + "; ".join(problems[:10])
            + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else "")
            + ". Build the model and optimizer the checkpoint was saved from"
        )
    inner.load_state_dict(mapped)


class DeferredRNG(RNGState):
    """An ``RNGState`` whose ``load_state_dict`` keeps the state until ``apply()``: a resume
    reads (and verifies) everything at once, and restores the generators when the training
    loop stands where the saving run stood."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: dict[str, Any] | None = None

    def load_state_dict(self, state: Mapping[str, Any], /) -> None:
        self.saved = dict(state)

    def apply(self) -> None:
        """Restore the generators from the state read (nothing when none was read)."""
        if self.saved is not None:
            super().load_state_dict(self.saved)


class NamedOptimizer:
    """``optimizer`` as a ``state_dict`` / ``load_state_dict`` object whose state is keyed
    by the names of ``module``'s parameters instead of their positions, for frameworks
    that save what they are handed (Lightning Fabric's ``fabric.save(path, state)``)."""

    def __init__(self, optimizer: Any, module: torch.nn.Module) -> None:
        _inner(optimizer)  # a wrapper around no torch optimizer is refused here
        self.optimizer = optimizer
        # Fabric's wrapper: the names of the module it wraps (no "_forward_module." prefix)
        inner = (
            getattr(module, "module", None) if type(module).__name__ == "_FabricModule" else None
        )
        self.module = inner if isinstance(inner, torch.nn.Module) else module

    def state_dict(self) -> dict[str, Any]:
        return named_state(self.optimizer, self.module)

    def load_state_dict(self, state: Mapping[str, Any], /) -> None:
        apply_named(self.optimizer, self.module, state, "the checkpoint")


class LoaderState:
    """A torchdata ``StatefulDataLoader`` as a ``state_dict`` / ``load_state_dict`` object
    that resumes exactly (what the loader's own state misses: its generators' states, and
    the resumed iterator built before the global RNG is restored; see
    ``statekeeper.data.torchdata``). Restore the RNG after it."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        return capture_loader("loader", self.loader)

    def load_state_dict(self, state: Mapping[str, Any], /) -> None:
        restore_loader("loader", self.loader, state)


def plain_tree(value: Any) -> Any:
    """``value`` with dict subclasses (Lightning's ``AttributeDict``) as plain dicts, which
    statekeeper stores without pickle (an ``OrderedDict`` stays one)."""
    if isinstance(value, dict) and type(value) is not OrderedDict:
        return {k: plain_tree(v) for k, v in value.items()}
    if type(value) is list:
        return [plain_tree(v) for v in value]
    return value
