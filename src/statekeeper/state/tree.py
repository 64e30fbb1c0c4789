"""Flatten a nested state into a JSON skeleton plus named tensors, and back.

Tensor leaves become ``{"$tensor": name}`` references (numpy arrays ``{"$ndarray": name}``);
``name`` is the leaf's key path joined with ``/`` (``"model/encoder.weight"``), made unique
with a ``~N`` suffix when two paths print the same (keys ``1`` and ``"1"``). Everything else
goes through the tagged JSON codec of :mod:`statekeeper.format.values`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from statekeeper.errors import UnsupportedValueError
from statekeeper.format.torch_dtypes import SUPPORTED_DTYPES
from statekeeper.format.values import Json, decode_value, encode_value

__all__ = ["Flat", "flatten", "unflatten"]


@dataclass(frozen=True)
class Flat:
    """A flattened state: the JSON skeleton and its tensors in traversal order."""

    skeleton: Json
    tensors: dict[str, torch.Tensor]


def flatten(state: Mapping[str, Any], root: str = "") -> Flat:
    """Split ``state`` into a JSON skeleton and named tensors (no copies are made)."""
    tensors: dict[str, torch.Tensor] = {}

    def on_tensor(path: str, value: Any) -> Json:
        name = path or "<root>"
        n = 1
        while name in tensors:
            n += 1
            name = f"{path}~{n}"
        if isinstance(value, np.ndarray):
            try:
                tensor = torch.from_numpy(np.ascontiguousarray(value))
            except TypeError:
                raise UnsupportedValueError(path, value) from None
            if tensor.dtype not in SUPPORTED_DTYPES:
                raise UnsupportedValueError(path, value, f"numpy arrays of dtype {value.dtype}")
            tensors[name] = tensor
            return {"$ndarray": name}
        if value.dtype not in SUPPORTED_DTYPES:
            raise UnsupportedValueError(path, value, f"tensors of dtype {value.dtype}")
        # detached only when it needs to be: a state dict's tensors are detached already,
        # and detaching a DTensor costs tens of microseconds (inside an async save's stall)
        tensors[name] = value.detach() if value.requires_grad else value
        return {"$tensor": name}

    skeleton = encode_value(dict(state), root, on_tensor)
    return Flat(skeleton, tensors)


def unflatten(skeleton: Json, lookup: Callable[[str], torch.Tensor], root: str = "") -> Any:
    """Rebuild the nested state; ``lookup(name)`` returns the tensor stored under ``name``.

    Raises ``ValueError`` with the key path when the skeleton is malformed.
    """

    def on_ref(tag: str, name: str) -> Any:
        tensor = lookup(name)
        if tag == "$ndarray":
            return tensor.numpy().copy()
        return tensor

    return decode_value(skeleton, root, on_ref)
