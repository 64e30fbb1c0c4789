"""Averaging rules as small frozen dataclasses: how much of the new weights each update takes.

A rule answers ``weight(update)``, the interpolation weight ``w`` of update number
``update`` (0-based, counting the updates that averaged), and the average moves as
``avg <- avg + w * (new - avg)`` (one fused ``lerp``). The first update copies (``w = 1``).

- ``EMA(decay)``: ``w = 1 - decay``; with ``warmup_power`` the decay ramps up as
  ``1 - (1 + t / inv_gamma) ** -warmup_power`` (clamped to ``[min_decay, decay]``),
  where ``t`` counts updates after ``update_after_step``;
- ``SWA()``: ``w = 1 / (n + 1)``, the running mean.

``update_after_step`` (EMA) skips the first calls entirely except that the average keeps
copying the model until then; ``every`` averages only every n-th call. The rule holds no
mutable state: the counters live in the AveragedModel's buffers, so a resumed average is
bitwise identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from statekeeper.errors import InvalidArgumentError

__all__ = ["EMA", "SWA", "AveragingRule"]


class AveragingRule:
    """Base of the averaging rules."""

    update_after_step: int = 0
    every: int = 1

    def weight(self, averaged: int) -> float:
        """Interpolation weight for the ``averaged``-th averaging update (0 copies: 1.0).

        Args:
            averaged: How many averaging updates came before this one.

        Returns:
            The weight of the current model in the new average, in [0, 1].
        """
        raise NotImplementedError


def _check_schedule(update_after_step: object, every: object) -> None:
    if type(update_after_step) is not int or update_after_step < 0:
        raise InvalidArgumentError(
            f"update_after_step must be an int >= 0, got {update_after_step!r}"
        )
    if type(every) is not int or every < 1:
        raise InvalidArgumentError(f"every must be an int >= 1, got {every!r}")


def _unit(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise InvalidArgumentError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class EMA(AveragingRule):
    """Exponential moving average with constant ``decay`` or a power warmup to it.

    Args:
        decay: The weight of the average, in [0, 1].
        update_after_step: Updates before averaging starts (the average copies the model).
        every: Average every ``every``-th update.
        warmup_power: With a value, the decay ramps up as
            ``1 - (1 + n / inv_gamma) ** -warmup_power``, bounded by ``decay``.
        inv_gamma: The warmup's time scale.
        min_decay: The warmup's lower bound.

    Raises:
        InvalidArgumentError: A value out of its range.
    """

    decay: float = 0.999
    update_after_step: int = 0
    every: int = 1
    warmup_power: float | None = None
    inv_gamma: float = 1.0
    min_decay: float = 0.0

    def __post_init__(self) -> None:
        _unit("decay", self.decay)
        _unit("min_decay", self.min_decay)
        _check_schedule(self.update_after_step, self.every)
        if self.min_decay > self.decay:
            raise InvalidArgumentError(f"min_decay {self.min_decay} is above decay {self.decay}")
        if self.warmup_power is not None and not (
            isinstance(self.warmup_power, int | float) and 0 < self.warmup_power < math.inf
        ):
            raise InvalidArgumentError(
                f"warmup_power must be a positive number, got {self.warmup_power!r}"
            )
        if not isinstance(self.inv_gamma, int | float) or not 0 < self.inv_gamma < math.inf:
            raise InvalidArgumentError(
                f"inv_gamma must be a positive number, got {self.inv_gamma!r}"
            )

    def current_decay(self, averaged: int) -> float:
        """The decay at the ``averaged``-th averaging update (the warmup's, if any).

        Args:
            averaged: How many averaging updates came before this one.

        Returns:
            The decay, in [``min_decay``, ``decay``].
        """
        if self.warmup_power is None:
            return self.decay
        ramp = 1.0 - float((1.0 + averaged / self.inv_gamma) ** -self.warmup_power)
        return min(self.decay, max(self.min_decay, ramp))

    def weight(self, averaged: int) -> float:
        return 1.0 if averaged == 0 else 1.0 - self.current_decay(averaged)


@dataclass(frozen=True)
class SWA(AveragingRule):
    """Stochastic weight averaging: the equal-weight running mean of every averaged update.

    Args:
        update_after_step: Updates before averaging starts (the average copies the model).
        every: Average every ``every``-th update.

    Raises:
        InvalidArgumentError: ``update_after_step`` < 0 or ``every`` < 1.
    """

    update_after_step: int = 0
    every: int = 1

    def __post_init__(self) -> None:
        _check_schedule(self.update_after_step, self.every)

    def weight(self, averaged: int) -> float:
        return 1.0 / (averaged + 1)
