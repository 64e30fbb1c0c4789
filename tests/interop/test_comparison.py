"""statekeeper.audit.diff: keys, shapes, dtypes, values and per-tensor differences, any formats."""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from tests.interop import formats

import statekeeper as sk


def test_identical_checkpoints_are_equal(tmp_path: Path) -> None:
    model, opt = formats.trained()
    state = {"model": model, "opt": opt, "epoch": 3}
    sk.save(tmp_path / "a", state, step=1)
    sk.save(tmp_path / "b", state, step=1)
    result = sk.audit.diff(tmp_path / "a", tmp_path / "b")
    assert result.equal and isinstance(result, sk.audit.DiffReport)
    assert not (result.only_a or result.only_b or result.changed or result.different)
    assert "model.fc.weight" in result.equal_tensors
    assert result.equal_values > 0


def test_permuted_key_order_is_equal() -> None:
    weights = formats.weights()
    permuted = OrderedDict(reversed(list(weights.items())))
    assert list(permuted) != list(weights)
    assert sk.audit.diff(weights, permuted).equal


def test_perturbed_tensor_is_listed_first_with_its_max_difference() -> None:
    a = formats.weights()
    b = {k: v.clone() for k, v in a.items()}
    b["fc.weight"][1, 2] += 0.5
    b["norm.bias"][0] += 1e-3
    result = sk.audit.diff(a, b)
    assert not result.equal
    assert [d.key for d in result.different] == ["fc.weight", "norm.bias"]
    first = result.different[0]
    assert first.max_abs == pytest.approx(0.5, rel=1e-6)
    assert first.max_rel == pytest.approx(0.5 / abs(float(b["fc.weight"][1, 2])), rel=1e-5)
    assert first.shape == (3, 4) and first.dtype_a == "float32"
    assert "fc.bias" in result.equal_tensors
    assert sk.audit.diff(a, b, atol=0.6).equal
    within = sk.audit.diff(a, b, atol=0.01)
    assert [d.key for d in within.different] == ["fc.weight"]


def test_keys_shapes_dtypes_and_values() -> None:
    a = {"w": torch.zeros(2, 3), "x": torch.ones(2), "only_a": torch.ones(1), "lr": 0.1,
         "i": torch.arange(3)}  # fmt: skip
    b = {"w": torch.zeros(3, 2), "x": torch.ones(2, dtype=torch.float64), "only_b": 1,
         "lr": 0.2, "i": torch.arange(3)}  # fmt: skip
    result = sk.audit.diff(a, b)
    assert result.only_a == ("only_a",) and result.only_b == ("only_b",)
    changes = {(c.key, c.what): (c.a, c.b) for c in result.changed}
    assert changes[("w", "shape")] == ("(2, 3)", "(3, 2)")
    assert changes[("x", "dtype")] == ("float32", "float64")
    assert changes[("lr", "value")] == ("0.1", "0.2")
    assert result.equal_tensors == ("x", "i")  # same values in another dtype: dtype change only
    assert not result.equal


def test_nan_in_the_same_place_is_equal_elsewhere_infinite() -> None:
    a = {"t": torch.tensor([1.0, math.nan])}
    assert sk.audit.diff(a, {"t": torch.tensor([1.0, math.nan])}).equal
    result = sk.audit.diff(a, {"t": torch.tensor([1.0, 2.0])})
    assert result.different[0].max_abs == math.inf


def test_wrapper_prefixes_are_stripped_on_request() -> None:
    weights = formats.weights()
    ddp = {f"module.{k}": v for k, v in weights.items()}
    compiled = {f"_orig_mod.{k}": v for k, v in weights.items()}
    plain = sk.audit.diff(ddp, compiled)
    assert len(plain.only_a) == len(weights) and not plain.equal
    stripped = sk.audit.diff(ddp, compiled, strip=("module.", "_orig_mod."))
    assert stripped.equal and len(stripped.equal_tensors) == len(weights)
    with pytest.raises(sk.errors.InvalidArgumentError, match="makes two keys"):
        sk.audit.diff({"module.w": torch.ones(1), "w": torch.ones(1)}, {}, strip=("module.",))


def test_across_formats_with_key(tmp_path: Path, lightning: tuple[Path, dict[str, object]]) -> None:
    model = formats.net()
    sk.save(tmp_path / "run", {"model": model, "epoch": 1}, step=1)
    weights = formats.safetensors_file(tmp_path / "w.safetensors", model.state_dict())
    result = sk.audit.diff(tmp_path / "run", weights, key="model")
    assert result.equal
    assert any("no entry 'model'" in note for note in result.notes)
    path, module_state = lightning
    torch_file = formats.torch_file(tmp_path / "m.pt", {"state_dict": module_state})
    assert sk.audit.diff(path, torch_file, key="state_dict").equal
    with pytest.raises(sk.errors.InvalidArgumentError, match="neither"):
        sk.audit.diff(weights, torch_file, key="nothing")
