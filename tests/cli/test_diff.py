"""`statekeeper diff`: exit 0 equal / 1 different, sorted by difference, --json, prefixes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from click.testing import Result
from tests.interop import formats

import statekeeper as sk

Invoke = Callable[..., Result]


def _json(result: Result) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_identical_exit_0(invoke: Invoke, tmp_path: Path) -> None:
    weights = formats.weights()
    a = formats.safetensors_file(tmp_path / "a.safetensors", weights)
    b = formats.torch_file(tmp_path / "b.pt", dict(reversed(list(weights.items()))))
    result = invoke("diff", a, b)
    assert result.exit_code == 0, result.output
    assert "7 tensor(s) and 0 value(s) equal" in result.stdout and "equal" in result.stdout
    data = _json(invoke("diff", a, b, "--json"))
    assert data["equal"] is True and len(data["equal_tensors"]) == 7


def test_perturbed_exit_1_largest_first(invoke: Invoke, tmp_path: Path) -> None:
    weights = formats.weights()
    changed = {k: v.clone() for k, v in weights.items()}
    changed["norm.weight"][0] += 0.25
    changed["fc.bias"][1] += 2.0
    a = formats.safetensors_file(tmp_path / "a.safetensors", weights)
    b = formats.safetensors_file(tmp_path / "b.safetensors", changed)
    result = invoke("diff", a, b)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "2 tensor(s) differ" in out
    assert out.index("fc.bias") < out.index("norm.weight")  # largest difference first
    data = _json(invoke("diff", a, b, "--json"))
    assert [d["key"] for d in data["different"]] == ["fc.bias", "norm.weight"]
    assert abs(data["different"][0]["max_abs"] - 2.0) < 1e-6
    assert data["equal"] is False
    assert invoke("diff", a, b, "--atol", "3").exit_code == 0


def test_prefixes_and_key_across_formats(invoke: Invoke, tmp_path: Path) -> None:
    model = formats.net()
    sk.save(tmp_path / "run", {"model": model, "epoch": 2}, step=1)
    ddp = formats.torch_file(
        tmp_path / "ddp.pt", {f"module.{k}": v for k, v in model.state_dict().items()}
    )
    assert invoke("diff", tmp_path / "run", ddp, "--key", "model").exit_code == 1
    result = invoke("diff", tmp_path / "run", ddp, "--key", "model", "--strip-prefix")
    assert result.exit_code == 0, result.output
    assert "no entry 'model'" in result.stdout


def test_keys_only_on_one_side_and_changes(invoke: Invoke, tmp_path: Path) -> None:
    a = formats.torch_file(tmp_path / "a.pt", {"w": torch.zeros(2), "lr": 0.1, "x": torch.ones(1)})
    b = formats.torch_file(tmp_path / "b.pt", {"w": torch.zeros(3), "lr": 0.2, "y": torch.ones(1)})
    result = invoke("diff", a, b)
    assert result.exit_code == 1
    assert "1 key(s) only in A" in result.stdout and "1 key(s) only in B" in result.stdout
    data = _json(invoke("diff", a, b, "--json"))
    assert {(c["key"], c["what"]) for c in data["changed"]} == {("w", "shape"), ("lr", "value")}


def test_errors(invoke: Invoke, tmp_path: Path) -> None:
    evil = tmp_path / "evil.pt"
    torch.save({"f": print}, evil)
    result = invoke("diff", evil, evil)
    assert result.exit_code == 1
    assert "refused to load this pickle file" in result.stderr and "builtins.print" in result.stderr
    result = invoke("diff", tmp_path / "missing-run", evil)
    assert result.exit_code == 2 and "does not exist" in result.stderr
