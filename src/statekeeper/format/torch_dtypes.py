"""The dtype table of :mod:`statekeeper.format.dtypes`, keyed by ``torch.dtype``.

Derived from that table, never written out a second time: the safetensors reader and writer
look codes up here.
"""

from __future__ import annotations

import torch

from statekeeper.format.dtypes import TABLE, dtype_from_name

__all__ = ["DTYPE_CODES", "DTYPE_OF_CODE", "SUPPORTED_DTYPES"]

DTYPE_CODES: dict[torch.dtype, str] = {dtype_from_name(name): code for name, code, _ in TABLE}
"""The safetensors code of each dtype a checkpoint may hold."""

DTYPE_OF_CODE: dict[str, torch.dtype] = {code: dtype for dtype, code in DTYPE_CODES.items()}
"""The dtype of each safetensors code."""

SUPPORTED_DTYPES: frozenset[torch.dtype] = frozenset(DTYPE_CODES)
"""Dtypes that safetensors can both write and read back."""
