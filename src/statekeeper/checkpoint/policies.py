"""When to save, and which committed steps to keep: small frozen dataclasses composed with ``|``.

Save policies answer ``should_save(step, seconds_since_last_save)``:
``EverySteps(n)``, ``EverySeconds(s)``, ``AtSteps(...)``; ``a | b`` saves when either does.
``OnSignal(SIGTERM, SIGUSR1)`` saves at the first step boundary after one of the signals
arrives (pre-emption; see :mod:`statekeeper.checkpoint.signals`).

Retention policies answer ``keep(checkpoints) -> set of steps``:
``KeepLatest(n)``, ``KeepBest(n, metric=..., mode=MetricGoal.MIN)``, ``KeepEvery(n)``; ``a | b``
keeps the union. The Checkpointer always keeps the newest committed step and the step the
run resumed from, whatever the policy says, and applies retention only after a commit.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.checkpoint.signals import signal_of
from statekeeper.errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "AtSteps", "EverySeconds", "EverySteps", "KeepBest", "KeepEvery", "KeepLatest",
    "MetricGoal", "OnSignal", "Retention", "SavePolicy", "signals_of",
]  # fmt: skip


def _positive_int(name: str, value: object) -> None:
    if type(value) is not int:  # a bool, a float or a str is the wrong type, not a bad value
        raise InvalidArgumentTypeError(
            f"{name} must be a positive int, got {type(value).__name__} {value!r}; pass e.g. 10"
        )
    if value < 1:
        raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class _PositiveN:
    """A policy of one positive int ``n``, checked on construction."""

    n: int

    def __post_init__(self) -> None:
        _positive_int(f"{type(self).__name__}(n)", self.n)


P = TypeVar("P", bound="_Composable[Any]")


class _Composable(Generic[P]):
    """``a | b`` of one family of policies (``P``: the save policies, or the retention
    policies): the family's union policy of both sides' parts, nested unions flattened."""

    _family: ClassVar[type[Any]]
    """The family's base class (set on it by ``__init_subclass__``)."""
    _union: ClassVar[type[Any]]
    """The family's union policy (``AnySave``, ``KeepAny``), set once it is defined."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _Composable in cls.__bases__:  # the base of a family: SavePolicy, Retention
            cls._family = cls

    def __or__(self, other: P) -> P:
        if not isinstance(other, self._family):
            return NotImplemented
        union: P = self._union((*_parts(self), *_parts(other)))
        return union


def _parts(policy: _Composable[Any]) -> tuple[Any, ...]:
    """The policies a union holds; any other policy alone."""
    return policy.policies if isinstance(policy, policy._union) else (policy,)


class SavePolicy(_Composable["SavePolicy"]):
    """Base of the save policies."""

    def should_save(self, step: int, seconds_since_save: float) -> bool:
        """Whether the Checkpointer saves at ``step``.

        Args:
            step: The step ``maybe_save`` was called with.
            seconds_since_save: Seconds since the last save (or since the start).

        Returns:
            True to save now.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class EverySteps(_PositiveN, SavePolicy):
    """Save when ``step`` is a multiple of ``n``.

    Args:
        n: The interval in steps.

    Raises:
        InvalidArgumentError: ``n`` is not a positive int (``InvalidArgumentTypeError``
            when it is no int at all).
    """

    def should_save(self, step: int, seconds_since_save: float) -> bool:
        return step % self.n == 0


@dataclass(frozen=True)
class EverySeconds(SavePolicy):
    """Save when at least ``seconds`` passed since the last save (or since the start).

    Args:
        seconds: The interval in seconds, > 0.

    Raises:
        InvalidArgumentError: ``seconds`` is not a positive finite number.
    """

    seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, int | float):
            raise InvalidArgumentTypeError(
                f"EverySeconds needs a positive finite number of seconds, got "
                f"{type(self.seconds).__name__} {self.seconds!r}; pass e.g. EverySeconds(600)"
            )
        if not 0 < self.seconds < math.inf:
            raise InvalidArgumentError(
                f"EverySeconds needs a positive finite number, got {self.seconds!r}"
            )

    def should_save(self, step: int, seconds_since_save: float) -> bool:
        return seconds_since_save >= self.seconds


@dataclass(frozen=True)
class AtSteps(SavePolicy):
    """Save at exactly these steps.

    Args:
        *steps: The steps to save at.

    Raises:
        InvalidArgumentError: A step is not an int >= 0 (``InvalidArgumentTypeError`` when
            it is no int).
    """

    steps: frozenset[int]

    def __init__(self, *steps: int) -> None:
        for s in steps:
            if type(s) is not int:
                raise InvalidArgumentTypeError(
                    f"AtSteps takes non-negative ints, got {type(s).__name__} {s!r}; pass e.g. "
                    "AtSteps(100, 200)"
                )
            if s < 0:
                raise InvalidArgumentError(f"AtSteps takes non-negative ints, got {s!r}")
        object.__setattr__(self, "steps", frozenset(steps))

    def should_save(self, step: int, seconds_since_save: float) -> bool:
        return step in self.steps


@dataclass(frozen=True)
class OnSignal(SavePolicy):
    """Save at the first step boundary after one of ``signals`` arrives: pre-emption.

    ``Checkpointer(..., every=EverySteps(500) | OnSignal(signal.SIGTERM, signal.SIGUSR1))``
    installs a handler for each signal that only records it. The next ``maybe_save`` saves
    (synchronously, after any background save), sets ``Checkpointer.preempted`` and the loop
    exits, with ``Checkpointer.PREEMPTED_EXIT_CODE`` for a scheduler that requeues. In a
    multi-process job every rank saves at the same step when any rank was signalled.
    Signals are ``signal.Signals``, numbers or names (``"SIGUSR1"``).

    Args:
        *signals: The signals that mean pre-emption.

    Raises:
        InvalidArgumentError: No signal, or one that is not a signal of this platform.
    """

    signals: tuple[signal.Signals, ...]

    def __init__(self, *signals: signal.Signals | int | str) -> None:
        if not signals:
            raise InvalidArgumentError("OnSignal needs at least one signal, e.g. signal.SIGTERM")
        object.__setattr__(self, "signals", tuple(dict.fromkeys(map(signal_of, signals))))

    def should_save(self, step: int, seconds_since_save: float) -> bool:
        return False  # the Checkpointer's signal watch decides (it saw the signal or not)


def signals_of(policy: SavePolicy | None) -> tuple[signal.Signals, ...]:
    """The signals the ``OnSignal`` parts of ``policy`` watch (in order, once each)."""
    if policy is None:
        return ()
    found = (s for p in _parts(policy) if isinstance(p, OnSignal) for s in p.signals)
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class AnySave(SavePolicy):
    """Saves when any of its policies does (built by ``|``)."""

    policies: tuple[SavePolicy, ...]

    def should_save(self, step: int, seconds_since_save: float) -> bool:
        return any(p.should_save(step, seconds_since_save) for p in self.policies)


class MetricGoal(StrEnum):
    """Which value of ``KeepBest``'s metric is the best: ``MIN`` (a loss) or ``MAX`` (an
    accuracy)."""

    MIN = "min"
    MAX = "max"


class Retention(_Composable["Retention"]):
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
class KeepLatest(_PositiveN, Retention):
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
        mode: ``Mode.MIN`` (lowest is best) or ``Mode.MAX``.

    Raises:
        InvalidArgumentError: ``n`` is not a positive int, ``metric`` is empty or ``mode``
            is no ``Mode``.
    """

    n: int
    metric: str
    mode: MetricGoal = MetricGoal.MIN

    def __post_init__(self) -> None:
        _positive_int("KeepBest(n)", self.n)
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
class KeepEvery(_PositiveN, Retention):
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


SavePolicy._union = AnySave
Retention._union = KeepAny
