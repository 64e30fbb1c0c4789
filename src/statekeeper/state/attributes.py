"""A module's plain attributes: what it holds besides parameters, buffers and submodules.

Shared by the doctor (SK004 and friends look for tensors held there) and by
:func:`statekeeper.clearing.clear_state` (which frees them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["INTERNALS", "held_tensors", "plain_attributes"]

INTERNALS = frozenset(vars(torch.nn.Module()))  # _parameters, _buffers, hooks, training...


def plain_attributes(model: torch.nn.Module) -> Iterator[tuple[str, str, Any]]:
    """(module path, attribute, value) for every instance attribute of every submodule that
    is not ``nn.Module``'s own machinery (``_parameters``, ``_buffers``, hooks, ``training``)."""
    for path, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr not in INTERNALS:
                yield path, attr, value


def held_tensors(value: Any) -> list[torch.Tensor] | None:
    """The tensors of a tensor attribute or of a list/tuple/dict of tensors (one level
    deep); None for any other value."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple | dict):
        items = value.values() if isinstance(value, dict) else value
        found = [v for v in items if isinstance(v, torch.Tensor)]
        return found or None
    return None
