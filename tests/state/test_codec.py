"""The tagged JSON codec and the tree flattener round-trip random nested states."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers.orders import key_orders

from statekeeper.errors import UnsupportedValueError
from statekeeper.format.values import encode_value
from statekeeper.format.values_decode import decode_value
from statekeeper.state.tree import flatten, unflatten
from statekeeper.testing import first_difference

floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**200), max_value=2**200),
    floats,
    st.text(max_size=12),
    st.binary(max_size=16),
    st.complex_numbers(allow_nan=False, allow_infinity=True),
    st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn]),
    st.lists(st.integers(0, 9), max_size=4).map(torch.Size),
    st.sampled_from([torch.device("cpu"), torch.device("cuda:1")]),
    st.sampled_from(
        [np.float32(1.5), np.int64(-3), np.bool_(True), np.float16(np.inf), np.uint8(7)]
    ),
)
tensors = st.builds(
    lambda shape, dtype: (
        torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape).to(dtype)
    ),
    st.lists(st.integers(0, 3), max_size=3),
    st.sampled_from([torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.uint8]),
)
keys = st.one_of(
    st.text(max_size=8), st.integers(-5, 5), st.tuples(st.integers(0, 3), st.text(max_size=3))
)


def _trees(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.dictionaries(keys, children, max_size=4),
            st.dictionaries(st.text(max_size=6), children, max_size=4).map(OrderedDict),
        ),
        max_leaves=20,
    )


def _same(a: Any, b: Any) -> bool:
    """statekeeper.testing's comparison (types, dtypes, bits, NaN) and the same key orders."""
    return first_difference(a, b) is None and list(key_orders(a)) == list(key_orders(b))


def _no_tensor(path: str, value: Any) -> Any:
    raise AssertionError("no tensors expected")


def _no_ref(tag: str, name: str) -> Any:
    raise AssertionError("no refs expected")


@settings(max_examples=150, deadline=None)
@given(_trees(scalars))
def test_value_codec_round_trips_through_json_text(value: Any) -> None:
    text = json.dumps(encode_value(value, "", _no_tensor), allow_nan=False)
    assert _same(decode_value(json.loads(text), "", _no_ref), value)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=6), _trees(st.one_of(scalars, tensors)), max_size=4
    )
)
def test_tree_round_trips_with_tensors(state: dict[str, Any]) -> None:
    flat = flatten(state)
    assert all(isinstance(t, torch.Tensor) for t in flat.tensors.values())
    text = json.dumps(flat.skeleton, allow_nan=False)
    assert _same(unflatten(json.loads(text), flat.tensors.__getitem__), state)


def test_tensor_names_are_key_paths_and_unique() -> None:
    flat = flatten({"m": {1: torch.zeros(1), "1": torch.ones(1)}, "x": [torch.zeros(2)]})
    assert list(flat.tensors) == ["m/1", "m/1~2", "x/0"]


def test_numpy_arrays_come_back_as_numpy() -> None:
    arr = np.arange(6, dtype=np.uint32).reshape(2, 3)
    flat = flatten({"a": arr})
    back = unflatten(flat.skeleton, flat.tensors.__getitem__)
    assert isinstance(back["a"], np.ndarray)
    assert back["a"].dtype == np.uint32
    assert np.array_equal(back["a"], arr)


def test_module_state_dict_metadata_survives() -> None:
    sd = torch.nn.BatchNorm1d(3).state_dict()
    flat = flatten({"bn": sd})
    back = unflatten(json.loads(json.dumps(flat.skeleton)), flat.tensors.__getitem__)["bn"]
    assert isinstance(back, OrderedDict)
    # (typing) OrderedDict's _metadata, set by state_dict() and untyped
    assert back._metadata == sd._metadata  # type: ignore[attr-defined]


class _Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": {"b": _Opaque()}}, "a/b"),
        ({"a": [1, {2: {3}}]}, "a/1/2"),
        ({"a": np.array([object()], dtype=object)}, "a"),
        ({"a": {frozenset({1}): 1}}, "a"),
    ],
)
def test_unsupported_values_name_the_key_path(value: dict[str, Any], path: str) -> None:
    with pytest.raises(UnsupportedValueError) as info:
        flatten(value)
    assert info.value.key_path == path
    assert "pickle" in str(info.value)


@pytest.mark.parametrize(
    "bad",
    [
        {"$float": "1.0"},
        {"$nope": 1},
        {"$tuple": 3},
        {"$dict": [[[1], 2]]},
        {"$numpy": "object", "value": 1},
        {"$size": ["a"]},
        {"$dtype": "not_a_dtype"},
    ],
)
def test_malformed_tags_are_value_errors(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"<root>|unhashable|unknown"):
        decode_value(bad, "", _no_ref)
