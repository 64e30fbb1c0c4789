"""The Rule extension point and the Target rules look at.

A rule has an ``id`` (``SKnnn``), a one-line ``summary``, the ``needs`` it has of the
target, and ``check(target)``, which yields findings. Rules run in the order of
:data:`statekeeper.doctor.rules.RULES`, each once per diagnosis, on the same
:class:`Target`. A rule whose needs the target cannot meet is skipped, and the report says
why. A rule never writes to the user's run directory, builds fresh instances through the
factory instead of mutating the target's model where it can, and restores any global state
it touches (RNG, train/eval mode, grad mode).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.errors import InvalidArgumentError

__all__ = ["Need", "Rule", "Target"]


class Need(StrEnum):
    MODEL = "model"  # an nn.Module
    INPUT = "example input"  # something to call the model with
    FACTORY = "factory"  # a way to build fresh instances
    SPEC = "importable factory"  # 'module:function', for rules that use subprocesses


@dataclass(frozen=True)
class Target:
    """What is diagnosed. ``state`` holds every named object the factory returned."""

    state: Mapping[str, Any]
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    example_input: Any = None
    factory: Callable[[], Any] | None = None
    spec: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def has(self, need: Need) -> bool:
        return {
            Need.MODEL: self.model is not None,
            Need.INPUT: self.model is not None and self.example_input is not None,
            Need.FACTORY: self.factory is not None,
            Need.SPEC: self.spec is not None,
        }[need]

    def require_model(self) -> torch.nn.Module:
        """The model, for a rule that needs one (``Need.MODEL``)."""
        if self.model is None:
            raise InvalidArgumentError(
                "this rule needs a model: the factory must return an nn.Module (or a dict "
                "with model=)"
            )
        return self.model

    def call(self, model: torch.nn.Module) -> Any:
        """``model`` applied to the example input (a tuple is unpacked, a dict passed by name)."""
        x = self.example_input() if callable(self.example_input) else self.example_input
        if isinstance(x, tuple):
            return model(*x)
        if isinstance(x, dict):
            return model(**x)
        return model(x)

    def fresh(self) -> Target:
        """A target built anew by the factory (a fresh model, optimizer and input)."""
        if self.factory is None:
            raise InvalidArgumentError(
                "this target has no factory: pass a function that builds the model, not a "
                "built model"
            )
        return Target.build(self.factory, spec=self.spec)

    @classmethod
    def build(cls, factory: Callable[[], Any], *, spec: str | None = None) -> Target:
        """Call ``factory`` and read what it returned.

        It may return an ``nn.Module``, or a dict: ``model``, ``optimizer``, ``example_input``
        (a value or a function returning one) and any other named objects of the training
        state (data loaders, schedulers...).
        """
        built = factory()
        if isinstance(built, torch.nn.Module):
            return cls({"model": built}, model=built, factory=factory, spec=spec)
        if not (isinstance(built, Mapping) and all(isinstance(k, str) for k in built)):
            raise InvalidArgumentError(
                "the doctor's factory must return an nn.Module or a dict (model=, optimizer=, "
                f"example_input=, other state entries), got {type(built).__name__}"
            )
        model = built.get("model")
        optimizer = built.get("optimizer")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise InvalidArgumentError(f"'model' must be an nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidArgumentError(
                f"'optimizer' must be a torch optimizer, got {type(optimizer).__name__}"
            )
        state = {k: v for k, v in built.items() if k != "example_input"}
        return cls(state, model, optimizer, built.get("example_input"), factory, spec)


class Rule(Protocol):
    id: str
    summary: str
    severity: Severity
    needs: frozenset[Need]

    def check(self, target: Target) -> Iterable[Finding]: ...
