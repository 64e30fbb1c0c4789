"""state/compare.py: the one comparison, its two modes, and what -0.0 and NaN are in each."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from statekeeper.errors import InvalidArgumentError
from statekeeper.state.compare import (
    BITWISE,
    NUMERIC,
    Criterion,
    Match,
    first_difference,
    leaves,
    same,
    state_difference,
)

NAN = float("nan")
CLOSE = Criterion(Match.ALLCLOSE, rtol=0.0, atol=0.1)


def _negative_nan() -> float:
    return -abs(NAN)  # the sign bit set: another bit pattern than float("nan")


def _sign_flipped(t: torch.Tensor) -> torch.Tensor:
    """``t`` with every element's sign bit flipped, bit by bit (arithmetic may canonicalize
    a NaN)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    sign = torch.tensor(1, dtype=ints) << (8 * t.element_size() - 1)
    return (t.view(ints) ^ sign).view(t.dtype)


def test_criterion_is_validated_on_construction() -> None:
    assert Criterion() == BITWISE and BITWISE.match is Match.BITWISE
    assert Criterion(Match.ALLCLOSE, rtol=0, atol=0) == NUMERIC
    assert Criterion("allclose", rtol=1).match is Match.ALLCLOSE
    assert Criterion(Match.ALLCLOSE, rtol=1).rtol == 1.0
    with pytest.raises(InvalidArgumentError, match="expected one of bitwise, allclose"):
        Criterion("close")
    for bad in (-1.0, math.inf, NAN):
        with pytest.raises(InvalidArgumentError, match="finite and >= 0"):
            Criterion(Match.ALLCLOSE, atol=bad)
    with pytest.raises(InvalidArgumentError, match="a number"):
        Criterion(Match.ALLCLOSE, rtol=True)
    with pytest.raises(InvalidArgumentError, match=r"Match\.ALLCLOSE only"):
        Criterion(Match.BITWISE, atol=1e-3)
    with pytest.raises(AttributeError):
        BITWISE.match = Match.ALLCLOSE


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_tensors_negative_zero_and_nan(dtype: torch.dtype) -> None:
    zero, negative_zero = torch.tensor([0.0], dtype=dtype), torch.tensor([-0.0], dtype=dtype)
    nan = torch.tensor([NAN], dtype=dtype)
    assert not same(zero, negative_zero) and same(zero, negative_zero, NUMERIC)
    assert same(nan, nan.clone()) and same(nan, nan.clone(), NUMERIC)
    assert not same(nan, _sign_flipped(nan))  # the same NaN with the sign bit set: other bits
    assert same(nan, _sign_flipped(nan), NUMERIC)
    assert not same(nan, zero, NUMERIC)
    inf = torch.tensor([math.inf], dtype=dtype)
    assert same(inf, inf.clone(), NUMERIC) and not same(inf, -inf, CLOSE)
    if dtype == torch.float32:
        assert not same(inf, torch.tensor([torch.finfo(dtype).max]), NUMERIC)


def test_scalars_negative_zero_and_nan() -> None:
    assert not same(0.0, -0.0) and same(0.0, -0.0, NUMERIC)
    assert same(NAN, _negative_nan())  # a stored scalar NaN keeps no sign or payload
    assert same(NAN, NAN, NUMERIC) and not same(NAN, 1.0, NUMERIC)
    assert not same(complex(0.0, -0.0), complex(0.0, 0.0))
    assert same(complex(0.0, -0.0), complex(0.0, 0.0), NUMERIC)
    assert not same(np.float32(-0.0), np.float32(0.0))
    assert same(np.float32(-0.0), np.float32(0.0), NUMERIC)
    assert same(np.float32(NAN), np.float32(NAN))
    assert not same(1, 1.0) and not same(True, 1) and not same(np.float32(1), np.float64(1))


def test_arrays_negative_zero_and_nan() -> None:
    zero, negative_zero = np.array([0.0]), np.array([-0.0])
    assert not same(zero, negative_zero) and same(zero, negative_zero, NUMERIC)
    nan = np.array([NAN])
    assert same(nan, nan.copy()) and same(nan, -nan, NUMERIC) and not same(nan, -nan)
    assert not same(np.zeros(2, np.float32), np.zeros(2, np.float64), NUMERIC)
    assert not same(np.zeros(2), np.zeros((2, 1)))
    assert same(np.array([1, "a"], dtype=object), np.array([1, "a"], dtype=object))


def test_allclose_tolerances_apply_to_floating_values_only() -> None:
    a = torch.tensor([1.0, 2.0])
    assert same(a, a + 0.05, CLOSE) and not same(a, a + 0.2, CLOSE)
    assert not same(a, a + 0.05, NUMERIC) and not same(a, a + 0.05)
    relative = Criterion(Match.ALLCLOSE, rtol=0.1)
    assert same(torch.tensor([100.0]), torch.tensor([105.0]), relative)
    assert not same(torch.tensor([1.0]), torch.tensor([1.5]), relative)
    assert same(1.0, 1.05, CLOSE) and not same(1.0, 1.5, CLOSE)
    assert same(complex(1, 1), complex(1, 1.05), CLOSE)
    assert same(np.array([1.0]), np.array([1.05]), CLOSE)
    loose = Criterion(Match.ALLCLOSE, atol=10.0)
    assert not same(torch.tensor([1]), torch.tensor([2]), loose)  # integers: exactly
    assert not same(1, 2, loose) and not same(np.array([1]), np.array([2]), loose)
    assert not same(torch.tensor([True]), torch.tensor([False]), loose)


def test_dtype_shape_and_kind_must_match() -> None:
    a = torch.zeros(3)
    assert not same(a, a.double(), NUMERIC) and not same(a, a.reshape(3, 1), NUMERIC)
    assert not same(a, a.numpy()) and not same(a, [0.0, 0.0, 0.0])
    assert same(torch.arange(4), torch.arange(4)) and not same(torch.arange(4), torch.ones(4))


def test_views_conjugates_and_float8_compare_by_value() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    assert same(base.t(), base.t().contiguous())  # strides are not part of the value
    assert same(base[:, ::2], base[:, ::2].clone())
    x = torch.tensor([1 + 2j, complex(0, -3)])
    assert same(x.conj(), torch.tensor([1 - 2j, 3j]))
    assert same(-base, (-base).clone())
    f8 = torch.tensor([1.0, -0.0, 2.0]).to(torch.float8_e4m3fn)
    plus = torch.tensor([1.0, 0.0, 2.0]).to(torch.float8_e4m3fn)
    assert not same(f8, plus) and same(f8, plus, NUMERIC)  # allclose lacks float8: widened
    assert same(torch.empty(0), torch.empty(0), NUMERIC)


def test_other_values_compare_by_type_and_equality() -> None:
    assert same("a", "a") and not same("a", "b") and same(None, None)

    class Odd:
        def __eq__(self, other: object) -> bool:
            raise TypeError("no")

        __hash__ = object.__hash__

    odd = Odd()
    assert same(odd, odd) and not same(odd, Odd())  # no plain bool: by identity


def test_state_difference_names_the_first_difference() -> None:
    state = {"model": OrderedDict(w=torch.ones(2)), "lr": 0.1, "hist": [1, 2.0, -0.0]}
    twin = {"lr": 0.1, "model": OrderedDict(w=torch.ones(2)), "hist": [1, 2.0, -0.0]}
    assert state_difference(state, twin) is None  # key order does not matter
    twin["hist"] = [1, 2.0, 0.0]
    assert state_difference(state, twin) == "hist/2: -0.0 vs 0.0"
    assert state_difference(state, twin, how=NUMERIC) is None
    twin["model"] = OrderedDict(w=torch.tensor([1.0, -1.0]))
    assert state_difference(state, twin) == "model/w: tensor values differ"
    assert state_difference({"w": torch.ones(2)}, {"w": torch.ones(3)}) == (
        "w: torch.float32(2,) vs torch.float32(3,)"
    )
    assert state_difference({"a": 1}, {"b": 1}) == "<root>: keys differ (['a', 'b'])"
    assert state_difference([1], [1, 2]) == "<root>: length 1 vs 2"
    assert state_difference((1,), [1]) == "<root>: tuple vs list"
    assert state_difference({"x": NAN}, {"x": _negative_nan()}) is None
    assert state_difference({"x": np.float32(NAN)}, {"x": np.float32(NAN)}) is None
    assert state_difference(np.array([-0.0]), np.array([0.0])) == "<root>: array values differ"


def test_leaves_walk_objects_and_first_difference_takes_a_mode() -> None:
    @dataclass
    class Out:
        logits: torch.Tensor
        cache: list[float]

    a = list(leaves(Out(torch.tensor([0.0, 1.0]), [0.5])))
    b = list(leaves(Out(torch.tensor([-0.0, 1.0]), [0.5])))
    assert [path for path, _ in a] == ["output", "output.logits", "output.cache", "output.cache[0]"]
    found = first_difference(a, b)
    assert found is not None and found[0] == "output.logits"
    assert first_difference(a, b, NUMERIC) is None
    shorter = list(leaves(Out(torch.tensor([0.0, 1.0]), [])))
    found = first_difference(a, shorter, NUMERIC)
    assert found is not None and found[0] == "output.cache"  # "<list of 1>" vs "<list of 0>"
    assert first_difference(a[:2], a) == ("output.cache", None, None)
