"""The Rule extension point.

A rule has an ``id`` (``SKnnn``), a one-line ``summary`` and ``check(target)``, which yields
findings. Rules run in the order of :data:`statekeeper.doctor.rules.RULES`, each once per
diagnosis, on the same :class:`Target`; a rule never writes to the user's run directory
and restores any global state (RNG, modes) it touches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from statekeeper.doctor.finding import Finding

__all__ = ["Rule", "Target"]


@dataclass(frozen=True)
class Target:
    """What is diagnosed: a training state (name -> object) and, when known, how to build it."""

    state: Mapping[str, Any]
    factory: Callable[[], Any] | None = None


class Rule(Protocol):
    id: str
    summary: str

    def check(self, target: Target) -> Iterable[Finding]: ...
