"""statekeeper.conversion.export: inference weights only, tied weights stored once and loadable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from tests.interop import formats

import statekeeper as sk
from statekeeper.testing import assert_state_equal


def _header(path: Path) -> tuple[set[str], dict[str, str]]:
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys()), dict(f.metadata() or {})


def test_tied_model_is_stored_once_and_loads_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = formats.TiedLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sk.save(tmp_path / "run", {"model": model, "opt": opt, "step": 9}, step=9)
    out = tmp_path / "model.safetensors"
    result = sk.conversion.export(tmp_path / "run", out)
    assert result.key == "model" and result.tensors == 4 and result.stored == 3
    assert result.aliases == {"lm_head.weight": "embed.weight"}
    keys, meta = _header(out)
    assert keys == {"embed.weight", "mix.weight", "mix.bias"}  # the tied weight once
    assert json.loads(meta["aliases"]) == {"lm_head.weight": "embed.weight"}
    assert meta["format"] == "pt"
    fresh = formats.TiedLM()
    fresh.load_state_dict(sk.read(out))  # strict: every key present
    assert_state_equal(fresh.state_dict(), model.state_dict())
    assert fresh.lm_head.weight is fresh.embed.weight  # still tied
    assigned = formats.TiedLM()
    assigned.load_state_dict(sk.read(out), assign=True)
    assert assigned.lm_head.weight.data_ptr() == assigned.embed.weight.data_ptr()


def test_only_persistent_module_state_goes_out(tmp_path: Path) -> None:
    model, opt = formats.trained()
    path = formats.torch_file(tmp_path / "full.pt", {"model": model.state_dict(),
                              "optimizer": opt.state_dict(), "epoch": 1})  # fmt: skip
    out = tmp_path / "w.safetensors"
    result = sk.conversion.export(path, out)
    keys, _ = _header(out)
    assert keys == set(model.state_dict())  # no optimizer, no epoch, no "scratch" buffer
    assert "scratch" not in keys and result.dropped == ()


def test_dtype_cast_keeps_integers_and_ties(tmp_path: Path) -> None:
    model = formats.TiedLM()
    sk.save(tmp_path / "run", {"model": model}, step=1)
    out = tmp_path / "bf16.safetensors"
    sk.conversion.export(tmp_path / "run", out, dtype="bf16")
    read = sk.read(out)
    assert {t.dtype for t in read.values()} == {torch.bfloat16}
    assert read["lm_head.weight"] is read["embed.weight"]
    assert torch.equal(read["mix.weight"], model.mix.weight.detach().bfloat16())
    net = formats.net()
    sk.save(tmp_path / "run2", {"model": net}, step=1)
    sk.conversion.export(tmp_path / "run2", tmp_path / "h.safetensors", dtype="fp16")
    halves = sk.read(tmp_path / "h.safetensors")
    assert halves["norm.num_batches_tracked"].dtype == torch.int64
    assert halves["fc.weight"].dtype == torch.float16
    with pytest.raises(sk.errors.InvalidArgumentError, match="int8"):
        sk.conversion.export(tmp_path / "run2", tmp_path / "x.safetensors", dtype="int8")


def test_prefixes_and_key_detection(
    tmp_path: Path,
    lightning: tuple[Path, dict[str, Any]],
    accelerate: tuple[Path, dict[str, Any]],
) -> None:
    path, module_state = lightning
    out = tmp_path / "pl.safetensors"
    assert sk.conversion.export(path, out, strip=("model.",)).key == "state_dict"
    assert_state_equal(sk.read(out), {k.removeprefix("model."): v for k, v in module_state.items()})
    folder, expected = accelerate
    sk.conversion.export(folder, tmp_path / "acc.safetensors")
    assert_state_equal(sk.read(tmp_path / "acc.safetensors"), expected["model"])
    ddp = formats.torch_file(tmp_path / "ddp.pt", {f"module.{k}": v for k, v in
                             formats.weights().items()})  # fmt: skip
    sk.conversion.export(ddp, tmp_path / "plain.safetensors", strip=("module.", "_orig_mod."))
    formats.Net().load_state_dict(sk.read(tmp_path / "plain.safetensors"))


def test_ambiguous_or_missing_key_is_an_error(tmp_path: Path) -> None:
    weights = formats.weights()
    path = formats.torch_file(tmp_path / "two.pt", {"a": weights, "b": weights})
    with pytest.raises(sk.errors.InvalidArgumentError, match="pass key="):
        sk.conversion.export(path, tmp_path / "x.safetensors")
    with pytest.raises(sk.errors.InvalidArgumentError, match="no entry 'c'"):
        sk.conversion.export(path, tmp_path / "x.safetensors", key="c")
    sk.conversion.export(path, tmp_path / "b.safetensors", key="b")
    assert_state_equal(sk.read(tmp_path / "b.safetensors"), weights)
