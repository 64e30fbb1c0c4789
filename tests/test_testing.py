"""statekeeper.testing's state comparison: bitwise, as state/compare.py defines it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from statekeeper.testing import assert_state_equal, first_difference


def test_equal_states_pass_in_any_key_order() -> None:
    state = {"model": {"w": torch.arange(4.0)}, "step": 3, "lr": math.nan}
    shuffled = {"lr": math.nan, "step": 3, "model": {"w": torch.arange(4.0)}}
    assert first_difference(state, shuffled) is None
    assert_state_equal(state, {"model": {"w": torch.arange(4.0)}, "step": 3, "lr": math.nan})


def test_negative_zero_is_a_difference_everywhere() -> None:
    for a, b in (
        (torch.tensor([0.0]), torch.tensor([-0.0])),
        (np.array([0.0]), np.array([-0.0])),
        (0.0, -0.0),
    ):
        assert first_difference({"x": a}, {"x": b}) is not None
    with pytest.raises(AssertionError, match=r"states differ at x: 0\.0 vs -0\.0"):
        assert_state_equal({"x": 0.0}, {"x": -0.0})


def test_nan_tensors_are_equal_with_the_same_bits_only() -> None:
    nan = torch.tensor([math.nan])
    assert first_difference(nan, nan.clone()) is None
    assert first_difference(nan, -nan) == "<root>: tensor values differ"


def test_the_message_names_the_path_and_what_differs() -> None:
    a = {"opt": {"state": [torch.ones(2), torch.zeros(2)]}}
    b = {"opt": {"state": [torch.ones(2), torch.ones(2)]}}
    assert first_difference(a, b) == "opt/state/1: tensor values differ"
    assert first_difference(a, b, "run") == "run/opt/state/1: tensor values differ"
    with pytest.raises(AssertionError, match="opt/state/1"):
        assert_state_equal(a, b)
