"""Which committed steps to keep: small frozen dataclasses composed with ``|``.

Retention policies answer ``keep(checkpoints) -> set of steps``:
``KeepLatest(n)``, ``KeepBest(n, metric=..., mode=MetricGoal.MIN)``, ``KeepEvery(n)``; ``a | b``
keeps the union. The Checkpointer always keeps the newest committed step and the step the
run resumed from, whatever the policy says, and applies retention only after a commit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.checkpoint.composable import Composable, PositiveN, positive_int
from statekeeper.errors import InvalidArgumentError

__all__ = ["KeepAny", "KeepBest", "KeepEvery", "KeepLatest", "MetricGoal", "Retention"]


class MetricGoal(StrEnum):
    """Which value of ``KeepBest``'s metric is the best: ``MIN`` (a loss) or ``MAX`` (an
    accuracy)."""

    MIN = "min"
    MAX = "max"


class Retention(Composable["Retention"]):
    """Base of the retention policies."""

    def keep(self, checkpoints: Sequence[CheckpointInfo]) -> set[int]:
        """The steps this policy keeps.

        Args:
            checkpoints: The committed steps, oldest first.

        Returns:
            The step numbers to keep; the Checkpointer removes the others.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class KeepLatest(PositiveN, Retention):
    """Keep the ``n`` newest steps.

    Args:
        n: How many of the newest committed steps survive.

    Raises:
        InvalidArgumentError: ``n`` is not a positive int (``InvalidArgumentTypeError``
            when it is no int at all).
    """

    def keep(self, checkpoints: Sequence[CheckpointInfo]) -> set[int]:
        return {c.step for c in sorted(checkpoints, key=lambda c: c.step)[-self.n :]}


@dataclass(frozen=True)
class KeepBest(Retention):
    """Keep the ``n`` steps with the best ``metric`` (steps without it are not ranked).

    Args:
        n: How many steps survive.
        metric: The name of a metric given to ``save`` / ``maybe_save``.
        mode: ``MetricGoal.MIN`` (lowest is best) or ``MetricGoal.MAX``.

    Raises:
        InvalidArgumentError: ``n`` is not a positive int, ``metric`` is empty or ``mode``
            is no ``MetricGoal``.
    """

    n: int
    metric: str
    mode: MetricGoal = MetricGoal.MIN

    def __post_init__(self) -> None:
        positive_int("KeepBest(n)", self.n)
        if not isinstance(self.metric, str) or not self.metric:
            raise InvalidArgumentError(f"KeepBest needs a metric name, got {self.metric!r}")
        if not isinstance(self.mode, MetricGoal):
            raise InvalidArgumentError(
                f"KeepBest mode must be MetricGoal.MIN or MetricGoal.MAX, got {self.mode!r}"
            )

    def keep(self, checkpoints: Sequence[CheckpointInfo]) -> set[int]:
        values = {c.step: _rankable(c.metrics.get(self.metric)) for c in checkpoints}
        ranked = [c for c in checkpoints if values[c.step] is not None]
        sign = 1 if self.mode is MetricGoal.MIN else -1
        # ties go to the newer step
        ranked.sort(key=lambda c: (sign * values[c.step], -c.step))  # type: ignore[operator]
        return {c.step for c in ranked[: self.n]}


def _rankable(value: object) -> float | None:
    """A metric as a float to rank by: None for what is no number or nan; an integer too
    large for a float (a damaged or crafted manifest) ranks as an infinity, never raises."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        number = math.inf if value > 0 else -math.inf
    return None if math.isnan(number) else number


@dataclass(frozen=True)
class KeepEvery(PositiveN, Retention):
    """Keep every step that is a multiple of ``n`` (milestones).

    Args:
        n: The interval of the steps kept.

    Raises:
        InvalidArgumentError: ``n`` is not a positive int (``InvalidArgumentTypeError``
            when it is no int at all).
    """

    def keep(self, checkpoints: Sequence[CheckpointInfo]) -> set[int]:
        return {c.step for c in checkpoints if c.step % self.n == 0}


@dataclass(frozen=True)
class KeepAny(Retention):
    """Keeps what any of its policies keeps (built by ``|``)."""

    policies: tuple[Retention, ...]

    def keep(self, checkpoints: Sequence[CheckpointInfo]) -> set[int]:
        return set().union(*(p.keep(checkpoints) for p in self.policies))


Retention._union = KeepAny
