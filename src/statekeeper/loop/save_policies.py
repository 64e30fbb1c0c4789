"""When to save: small frozen dataclasses composed with ``|``.

Save policies answer ``should_save(step, seconds_since_last_save)``:
``EverySteps(n)``, ``EverySeconds(s)``, ``AtSteps(...)``; ``a | b`` saves when either does.
``OnSignal(SIGTERM, SIGUSR1)`` saves at the first step boundary after one of the signals
arrives (pre-emption; see :mod:`statekeeper.loop.signals`).
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass

from statekeeper.checkpoint.composable import Composable, PositiveN, parts
from statekeeper.errors import InvalidArgumentError, InvalidArgumentTypeError
from statekeeper.loop.signals import signal_of

__all__ = [
    "AnySave",
    "AtSteps",
    "EverySeconds",
    "EverySteps",
    "OnSignal",
    "SavePolicy",
    "signals_of",
]


class SavePolicy(Composable["SavePolicy"]):
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
class EverySteps(PositiveN, SavePolicy):
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
    found = (s for p in parts(policy) if isinstance(p, OnSignal) for s in p.signals)
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class AnySave(SavePolicy):
    """Saves when any of its policies does (built by ``|``)."""

    policies: tuple[SavePolicy, ...]

    def should_save(self, step: int, seconds_since_save: float) -> bool:
        return any(p.should_save(step, seconds_since_save) for p in self.policies)


SavePolicy._union = AnySave
