"""Nested states as flat ``{dotted key: leaf}`` maps, the common ground of every format."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from statekeeper.errors import InvalidArgumentError

__all__ = [
    "WRAPPER_PREFIXES",
    "as_tensor",
    "flat_leaves",
    "select",
    "split_tensors",
    "strip_prefixes",
]

WRAPPER_PREFIXES = ("module.", "_orig_mod.")
"""Prefixes that wrappers add to every key: DDP/DataParallel and ``torch.compile``."""


def _has_structure(value: Any) -> bool:
    return isinstance(value, Mapping | torch.Tensor | np.ndarray | list | tuple)


def flat_leaves(state: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves keyed by their path joined with ``.``: tensors, numpy arrays and plain values.

    A list or tuple holding no container and no tensor counts as one leaf.
    """
    out: dict[str, Any] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, Mapping) and value:
            for key, child in value.items():
                walk(child, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list | tuple) and any(_has_structure(v) for v in value):
            for i, child in enumerate(value):
                walk(child, f"{path}.{i}" if path else str(i))
        else:
            if path in out:
                raise InvalidArgumentError(
                    f"two leaves have the key path {path!r} once joined with '.'; "
                    "compare or export a sub-tree with key= instead"
                )
            out[path] = value

    walk(state, prefix)
    return out


def as_tensor(value: Any) -> torch.Tensor | None:
    """A leaf that holds numbers as a tensor (detached; a numpy array without a copy when
    it is contiguous), or None for any other leaf."""
    if isinstance(value, torch.Tensor):
        return value.detach() if value.requires_grad else value
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.from_numpy(np.ascontiguousarray(value))
    return None


def split_tensors(flat: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensor leaves of ``flat`` (see :func:`as_tensor`) and the other leaves, in order."""
    tensors: dict[str, torch.Tensor] = {}
    others: dict[str, Any] = {}
    for key, value in flat.items():
        t = as_tensor(value)
        if t is None:
            others[key] = value
        else:
            tensors[key] = t
    return tensors, others


def strip_prefixes(flat: Mapping[str, Any], prefixes: Sequence[str]) -> dict[str, Any]:
    """Keys with any of ``prefixes`` removed from their start, repeatedly."""
    if not prefixes:
        return dict(flat)
    out: dict[str, Any] = {}
    for key, value in flat.items():
        short = key
        changed = True
        while changed:
            changed = False
            for prefix in prefixes:
                if prefix and short.startswith(prefix):
                    short = short[len(prefix) :]
                    changed = True
        if short in out:
            raise InvalidArgumentError(
                f"stripping {', '.join(map(repr, prefixes))} makes two keys {short!r}; "
                "strip fewer prefixes"
            )
        out[short] = value
    return out


def select(state: Mapping[str, Any], key: str, where: str) -> Any:
    """The sub-tree ``key`` (a top-level entry, or a dotted path into nested mappings)."""
    if key in state:
        return state[key]
    node: Any = state
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            known = ", ".join(map(repr, list(state)[:20]))
            raise InvalidArgumentError(f"{where} has no entry {key!r}; its entries: {known}")
        node = node[part]
    return node
