"""Live tensors that overlap themselves in memory (built with ``expand``/``meshgrid``): a
module's own ``load_state_dict`` cannot copy into them, so they get memory of their own."""

from __future__ import annotations

from collections.abc import Collection

import torch

__all__ = ["replace_overlapping"]


def replace_overlapping(name: str, module: torch.nn.Module, keys: Collection[str]) -> list[str]:
    """Give the self-overlapping live tensors of ``module`` named in ``keys`` their own
    (contiguous) memory; the ``entry/key`` names of those replaced."""
    replaced = []
    tensors = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    for key, t in tensors:
        if key in keys and t is not None and torch._debug_has_internal_overlap(t) == 1:
            with torch.no_grad():
                t.data = t.detach().clone(memory_format=torch.contiguous_format)
            replaced.append(f"{name}/{key}")
    return replaced
