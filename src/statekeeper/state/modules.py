"""Wrapper modules whose state_dict prefixes every key: saved and loaded as the inner module.

``torch.compile`` returns an ``OptimizedModule`` whose keys start with ``_orig_mod.``;
``DataParallel`` and ``DistributedDataParallel`` prefix ``module.``. A checkpoint saved
through the wrapper would not load into the bare model, nor the reverse. statekeeper always
saves and loads the innermost module, so the keys are the same whichever way it is wrapped.
"""

from __future__ import annotations

import torch

__all__ = ["unwrap"]

_WRAPPERS = ("OptimizedModule", "DataParallel", "DistributedDataParallel")


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside torch.compile / DataParallel / DDP wrappers (itself if unwrapped)."""
    while type(module).__name__ in _WRAPPERS:
        inner = getattr(module, "_orig_mod", None) or getattr(module, "module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        module = inner
    return module
