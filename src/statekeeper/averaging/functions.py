"""torch-compatible averaging functions (same names and signatures as ``swa_utils``).

They exist so that switching ``from torch.optim.swa_utils import ...`` to
``from statekeeper.averaging import ...`` keeps code working. Prefer ``rule=EMA(...)`` / ``SWA()``:
rules need no closure (the AveragedModel stays picklable) and know warmup schedules.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from statekeeper.errors import InvalidArgumentError

__all__ = ["get_ema_avg_fn", "get_ema_multi_avg_fn", "get_swa_avg_fn", "get_swa_multi_avg_fn"]


def _decay(decay: float) -> float:
    if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0.0 <= decay <= 1.0:
        raise InvalidArgumentError(f"decay must be a number in [0, 1], got {decay!r}")
    return float(decay)


def get_ema_multi_avg_fn(
    decay: float = 0.999,
) -> Callable[[list[Tensor], list[Tensor], Tensor | int], None]:
    """EMA over lists of tensors: ``ema <- lerp(ema, current, 1 - decay)``.

    Args:
        decay: The weight of the average, in [0, 1].

    Returns:
        ``multi_avg_fn(averaged, current, num_averaged)`` for :class:`AveragedModel`,
        updating the list ``averaged`` in place.

    Raises:
        InvalidArgumentError: ``decay`` is not a number in [0, 1].
    """
    weight = 1.0 - _decay(decay)

    @torch.no_grad()
    def ema_update(ema: list[Tensor], current: list[Tensor], _: Tensor | int) -> None:
        if ema and (ema[0].is_floating_point() or ema[0].is_complex()):
            torch._foreach_lerp_(ema, current, weight)
        else:  # integers cannot be interpolated: keep the newest value
            torch._foreach_copy_(ema, current)

    return ema_update


def get_swa_multi_avg_fn() -> Callable[[list[Tensor], list[Tensor], Tensor | int], None]:
    """The running mean over lists of tensors: ``avg <- avg + (current - avg) / (n + 1)``.

    Returns:
        ``multi_avg_fn(averaged, current, num_averaged)`` for :class:`AveragedModel`,
        updating the list ``averaged`` in place.
    """

    @torch.no_grad()
    def swa_update(avg: list[Tensor], current: list[Tensor], n: Tensor | int) -> None:
        if avg and (avg[0].is_floating_point() or avg[0].is_complex()):
            count = n if isinstance(n, Tensor) else torch.tensor(n)
            torch._foreach_lerp_(avg, current, float(1.0 / (count.item() + 1)))
        else:
            torch._foreach_copy_(avg, current)

    return swa_update


def get_ema_avg_fn(decay: float = 0.999) -> Callable[[Tensor, Tensor, Tensor | int], Tensor]:
    """EMA of one tensor.

    Args:
        decay: The weight of the average, in [0, 1].

    Returns:
        ``avg_fn(averaged, current, num_averaged)`` for :class:`AveragedModel`.

    Raises:
        InvalidArgumentError: ``decay`` is not a number in [0, 1].
    """
    d = _decay(decay)

    @torch.no_grad()
    def ema(ema_param: Tensor, current: Tensor, _: Tensor | int) -> Tensor:
        return d * ema_param + (1 - d) * current

    return ema


def get_swa_avg_fn() -> Callable[[Tensor, Tensor, Tensor | int], Tensor]:
    """Running mean of one tensor.

    Returns:
        ``avg_fn(averaged, current, num_averaged)`` for :class:`AveragedModel`.
    """

    @torch.no_grad()
    def swa(avg: Tensor, current: Tensor, n: Tensor | int) -> Tensor:
        return avg + (current - avg) / (n + 1)

    return swa
