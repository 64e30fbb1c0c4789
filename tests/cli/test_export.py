"""`statekeeper export`: model weights only, tied weights once, dtype cast, prefixes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from click.testing import Result
from safetensors import safe_open
from tests.interop import formats

import statekeeper as sk

Invoke = Callable[..., Result]


def test_export_tied_model_bf16(invoke: Invoke, tmp_path: Path) -> None:
    model = formats.TiedLM()
    opt = torch.optim.Adam(model.parameters())
    sk.save(tmp_path / "run", {"model": model, "opt": opt}, step=1)
    out = tmp_path / "model.safetensors"
    result = invoke("export", tmp_path / "run", "-o", out, "--dtype", "bf16")
    assert result.exit_code == 0, result.output
    assert "exported entry 'model': 4 tensor(s) (3 stored)" in result.stdout
    assert "cast to bfloat16" in result.stdout
    assert "alias: lm_head.weight -> embed.weight" in result.stdout
    with safe_open(str(out), framework="pt") as f:
        assert "lm_head.weight" not in set(f.keys())
        assert json.loads(f.metadata()["aliases"]) == {"lm_head.weight": "embed.weight"}
    fresh = formats.TiedLM().to(torch.bfloat16)
    fresh.load_state_dict(sk.read(out))


def test_export_json_with_key_and_prefix(invoke: Invoke, tmp_path: Path) -> None:
    weights = formats.weights()
    source = formats.torch_file(
        tmp_path / "s.pt", {"ema": {f"_orig_mod.{k}": v for k, v in weights.items()}, "step": 1}
    )
    out = tmp_path / "ema.safetensors"
    result = invoke("export", source, "-o", out, "--key", "ema", "--strip-prefix", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["key"] == "ema" and data["stored"] == 7 and data["aliases"] == {}
    formats.Net().load_state_dict(sk.read(out))


def test_export_errors(invoke: Invoke, tmp_path: Path) -> None:
    source = formats.torch_file(tmp_path / "s.pt", {"a": formats.weights(), "b": {"x": 1}})
    bad = invoke("export", source, "-o", tmp_path / "out.bin")
    assert bad.exit_code == 2 and "must be a .safetensors file" in bad.stderr
    missing = invoke("export", source, "-o", tmp_path / "o.safetensors", "--key", "nope")
    assert missing.exit_code == 2 and "no entry 'nope'" in missing.stderr


def test_export_never_replaces_a_file_without_overwrite(invoke: Invoke, tmp_path: Path) -> None:
    sk.save(tmp_path / "run", {"model": formats.TiedLM()}, step=1)
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"keep me")
    result = invoke("export", tmp_path / "run", "-o", out)
    assert result.exit_code == 1
    assert "--overwrite" in result.output
    assert out.read_bytes() == b"keep me"
    result = invoke("export", tmp_path / "run", "-o", out, "--overwrite")
    assert result.exit_code == 0, result.output
    formats.TiedLM().load_state_dict(sk.read(out))
