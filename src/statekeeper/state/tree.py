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
from statekeeper.format.malformed import FormatError
from statekeeper.format.torch_dtypes import SUPPORTED_DTYPES
from statekeeper.format.values import Json, encode_value
from statekeeper.format.values_decode import decode_value

__all__ = ["Flat", "flatten", "unflatten"]


@dataclass(frozen=True)
class Flat:
    """A flattened state: the JSON skeleton and its tensors in traversal order."""

    skeleton: Json
    tensors: dict[str, torch.Tensor]


_BIG_ENDIAN = (
    "state at {0}: a numpy array of non-native byte order ({1}); safetensors stores "
    "little-endian bytes only. Convert it in state_dict() with "
    "arr.astype(arr.dtype.newbyteorder('='))"
)


def _unstorable(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` has no bytes that a safetensors file can hold, with the fix, or None."""
    if tensor.is_nested:
        return (
            "a nested tensor (torch.nested), whose parts have different shapes; store its "
            "parts as a list (t.unbind()) and rebuild it with torch.nested.nested_tensor"
        )
    if tensor.layout is not torch.strided:
        return (
            f"a tensor of layout {tensor.layout} (sparse); store it dense (t.to_dense()), or its "
            "indices and values as two tensors"
        )
    if tensor.is_meta:
        return (
            "a meta tensor, which has a shape but no data; materialize it before saving "
            "(module.to_empty(device=...) and initialize, or load its weights)"
        )
    return None


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
            if not value.dtype.isnative:
                raise UnsupportedValueError(
                    path, value, reason=_BIG_ENDIAN.format(path, value.dtype)
                )
            try:
                tensor = torch.from_numpy(np.ascontiguousarray(value))
            except TypeError:
                raise UnsupportedValueError(path, value) from None
            if tensor.dtype not in SUPPORTED_DTYPES:
                raise UnsupportedValueError(path, value, f"numpy arrays of dtype {value.dtype}")
            tensors[name] = tensor
            return {"$ndarray": name}
        problem = _unstorable(value)
        if problem is not None:
            raise UnsupportedValueError(
                path, value, reason=f"state at {path or '<root>'}: {problem}"
            )
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

    Raises ``FormatError`` (a ``ValueError``) with the key path when the skeleton is malformed.
    """

    def on_ref(tag: str, name: str) -> Any:
        tensor = lookup(name)
        if tag == "$ndarray":
            try:
                array = tensor.numpy()
            except TypeError as exc:  # a dtype numpy lacks (bfloat16): a crafted manifest
                raise FormatError(f"{name!r} cannot be a numpy array ({exc})", key=name) from exc
            return array.copy()
        return tensor

    return decode_value(skeleton, root, on_ref)
