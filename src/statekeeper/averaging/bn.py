"""``update_bn``: recompute BatchNorm statistics of an (averaged) model over a loader.

torch's signature, plus ``input_fn`` for loaders whose batches are not a tensor or a
tuple/list whose first element is the input (dicts, custom objects). Momentum and the
train/eval mode of every module are restored afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from statekeeper.errors import InvalidArgumentError

__all__ = ["update_bn"]


def _default_input(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, list | tuple) and batch:
        return batch[0]
    raise InvalidArgumentError(
        f"update_bn cannot tell the input in a batch of type {type(batch).__name__}; pass "
        "input_fn=lambda batch: batch['image'] (or whatever selects the model's input)"
    )


@torch.no_grad()
def update_bn(
    loader: Iterable[Any],
    model: nn.Module,
    device: int | torch.device | str | None = None,
    *,
    input_fn: Callable[[Any], Any] | None = None,
) -> None:
    """Reset and recompute the running statistics of every BatchNorm in ``model``.

    Args:
        loader: The batches to run through ``model`` (a data loader).
        model: The model (an :class:`AveragedModel` or any module) whose BatchNorm statistics
            are recomputed.
        device: Where each batch is moved before the forward; ``None`` leaves it.
        input_fn: ``input_fn(batch)``, the model's input from a batch; default: the batch, or
            its first element for a list or tuple.

    Raises:
        InvalidArgumentError: An argument of the wrong kind.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    momenta = {m: m.momentum for m in norms}
    modes = {m: m.training for m in model.modules()}
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the whole loader
    pick = input_fn or _default_input
    model.train()
    try:
        for batch in loader:
            inputs = pick(batch)
            if device is not None:
                inputs = inputs.to(device)
            model(inputs)
    finally:
        for m, momentum in momenta.items():
            m.momentum = momentum
        for module, training in modes.items():
            module.train(training)
