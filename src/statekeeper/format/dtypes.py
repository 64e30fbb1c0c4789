"""The tensor dtypes a checkpoint may hold: one table of names, codes and sizes, without torch.

Manifests name dtypes as torch does (``"bfloat16"``); safetensors headers by code (``"BF16"``).
:data:`TABLE` gives both and the size of one element, in the order in which the safetensors
reference implementation lays out a file's data (widest alignment first), so that listing,
inspecting and verifying a step need not import torch. Every other view of dtypes derives
from it: the dictionaries below, and the torch mapping next to it
(:mod:`statekeeper.format.torch_dtypes`). ``tests/format`` checks the table against torch's
own dtypes and the reference implementation's bytes.

:func:`dtype_name` and :func:`dtype_from_name` convert between a ``torch.dtype`` and its
name for any torch dtype (the tagged JSON values of a state may name dtypes that safetensors
cannot hold); the latter imports torch when it is first called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from statekeeper.format.malformed import FormatError

if TYPE_CHECKING:
    import torch

__all__ = [
    "CODE_OF",
    "CODE_RANK",
    "ITEMSIZE",
    "SIZE_OF_CODE",
    "TABLE",
    "dtype_from_name",
    "dtype_name",
]

TABLE: tuple[tuple[str, str, int], ...] = (
    ("uint64", "U64", 8), ("int64", "I64", 8), ("float64", "F64", 8), ("complex64", "C64", 8),
    ("float32", "F32", 4), ("uint32", "U32", 4), ("int32", "I32", 4), ("bfloat16", "BF16", 2),
    ("float16", "F16", 2), ("uint16", "U16", 2), ("int16", "I16", 2),
    ("float8_e5m2fnuz", "F8_E5M2FNUZ", 1), ("float8_e4m3fnuz", "F8_E4M3FNUZ", 1),
    ("float8_e4m3fn", "F8_E4M3", 1), ("float8_e5m2", "F8_E5M2", 1), ("int8", "I8", 1),
    ("uint8", "U8", 1), ("bool", "BOOL", 1),
)  # fmt: skip
"""``(torch name, safetensors code, bytes per element)`` of every dtype a checkpoint may hold,
in the reference implementation's data order."""

ITEMSIZE: dict[str, int] = {name: size for name, _, size in TABLE}
"""Bytes per element of each dtype a checkpoint may hold (torch's names)."""

CODE_OF: dict[str, str] = {name: code for name, code, _ in TABLE}
"""The safetensors code of each dtype name."""

SIZE_OF_CODE: dict[str, int] = {code: size for _, code, size in TABLE}
"""Bytes per element of each safetensors code."""

CODE_RANK: dict[str, int] = {code: rank for rank, (_, code, _) in enumerate(TABLE)}
"""Where tensors of each code go in a file's data section (lower first)."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (any torch dtype)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; ``FormatError`` (a ``ValueError``) for a name
    that is no torch dtype."""
    import torch

    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise FormatError(f"unknown dtype {name!r}")
    return dtype
