"""The tensor dtypes a checkpoint may hold, by name, without torch.

Manifests name dtypes as torch does (``"bfloat16"``); safetensors headers by code (``"BF16"``).
This table gives both and the size of one element, so that listing and inspecting a step
need not import torch. ``tests/format`` checks it against torch's own dtypes and
:data:`statekeeper.format.safetensors_io.DTYPE_CODES`.
"""

from __future__ import annotations

__all__ = ["CODE_OF", "ITEMSIZE"]

ITEMSIZE: dict[str, int] = {
    "uint64": 8, "int64": 8, "float64": 8, "complex64": 8, "float32": 4, "uint32": 4,
    "int32": 4, "bfloat16": 2, "float16": 2, "uint16": 2, "int16": 2, "float8_e5m2fnuz": 1,
    "float8_e4m3fnuz": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1,
    "bool": 1,
}  # fmt: skip
"""Bytes per element of each dtype a checkpoint may hold (torch's names)."""

CODE_OF: dict[str, str] = {
    "uint64": "U64", "int64": "I64", "float64": "F64", "complex64": "C64", "float32": "F32",
    "uint32": "U32", "int32": "I32", "bfloat16": "BF16", "float16": "F16", "uint16": "U16",
    "int16": "I16", "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "int8": "I8", "uint8": "U8",
    "bool": "BOOL",
}  # fmt: skip
"""The safetensors code of each dtype name."""
