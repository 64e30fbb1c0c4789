"""One dtype table: names, safetensors codes and sizes, and the torch mapping derived from it."""

from __future__ import annotations

import pytest
import torch

from statekeeper.format import dtypes
from statekeeper.format.dtypes import CODE_OF, ITEMSIZE, TABLE, dtype_from_name, dtype_name
from statekeeper.format.torch_dtypes import (
    DTYPE_CODES,
    DTYPE_OF_CODE,
    SUPPORTED_DTYPES,
)


def test_the_table_has_each_name_and_code_once() -> None:
    names = [name for name, _, _ in TABLE]
    codes = [code for _, code, _ in TABLE]
    assert len(set(names)) == len(names) == len(set(codes)) == len(codes)
    assert list(CODE_OF) == names and list(ITEMSIZE) == names
    assert list(dtypes.CODE_RANK) == codes  # the order of a file's data section


def test_the_torch_mapping_is_the_table() -> None:
    assert {dtype_name(d): code for d, code in DTYPE_CODES.items()} == CODE_OF
    assert {dtype_name(d): d.itemsize for d in DTYPE_CODES} == ITEMSIZE
    assert {code: d for d, code in DTYPE_CODES.items()} == DTYPE_OF_CODE
    assert frozenset(DTYPE_CODES) == SUPPORTED_DTYPES


@pytest.mark.parametrize("dtype", [*sorted(SUPPORTED_DTYPES, key=str), torch.complex128])
def test_names_round_trip_for_any_torch_dtype(dtype: torch.dtype) -> None:
    assert dtype_from_name(dtype_name(dtype)) is dtype


@pytest.mark.parametrize("name", ["nope", "Tensor", "nn", "", 3, None])
def test_a_name_that_is_no_dtype_is_a_value_error(name: object) -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_from_name(name)


def test_the_helpers_have_one_home() -> None:
    """dtype_name/dtype_from_name live in format/dtypes.py, the torch mapping in
    format/torch_dtypes.py; no other module hands them out."""
    from statekeeper.format import safetensors_io, sharding, tensors

    assert not hasattr(tensors, "dtype_name") and "dtype_from_name" not in sharding.__all__
    assert "DTYPE_CODES" not in safetensors_io.__all__
    assert not hasattr(tensors, "SUPPORTED_DTYPES")
    assert dtype_name is not None and dtype_from_name is not None
    assert DTYPE_CODES is not None and SUPPORTED_DTYPES is not None
