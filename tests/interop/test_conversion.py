"""statekeeper.conversion.convert: every readable format into a statekeeper step (read back
equal), and any checkpoint into one safetensors file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from tests.interop import formats

import statekeeper as sk
from statekeeper.testing import assert_state_equal


def _round_trip(source: Path, out: Path, **options: Any) -> dict[str, Any]:
    result = sk.conversion.convert(source, out, **options)
    assert result.kind == "statekeeper" and result.step == options.get("out_step", 0)
    assert Path(result.path).name == f"step_{result.step:09d}"
    return sk.read(out)


def test_torch_file_to_statekeeper(tmp_path: Path) -> None:
    model, opt = formats.trained()
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 2}
    path = formats.torch_file(tmp_path / "a.pt", state)
    assert_state_equal(_round_trip(path, tmp_path / "run", out_step=5), state)
    live = formats.Net()  # loads straight into a live module
    sk.load(tmp_path / "run", {"model": live}, strict=sk.Strict.ALLOW_UNEXPECTED)
    assert_state_equal(live.state_dict(), state["model"])


def test_weights_only_formats_go_under_model(tmp_path: Path) -> None:
    weights = formats.weights()
    sources = [
        formats.safetensors_file(tmp_path / "w.safetensors", weights),
        formats.hf_folder(tmp_path / "hf", weights),
        formats.hf_folder(tmp_path / "hf-bin", weights, safe=False),
    ]
    for n, source in enumerate(sources):
        result = sk.conversion.convert(source, tmp_path / f"run{n}")
        assert result.wrapped_as == "model" and result.entries == ("model",)
        assert_state_equal(sk.read(tmp_path / f"run{n}"), {"model": weights})
        model = formats.Net()
        sk.load(tmp_path / f"run{n}", {"model": model})
        assert_state_equal(dict(model.state_dict()), weights)


def test_dcp_to_statekeeper(tmp_path: Path) -> None:
    model = formats.net()
    state = {"model": model.state_dict(), "meta": {"step": 4, "tag": "x"}}
    expected = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                "meta": {"step": 4, "tag": "x"}}  # fmt: skip
    source = formats.dcp_folder(tmp_path / "dcp", state)
    assert sk.conversion.convert(source, tmp_path / "run").source_format == "dcp"
    assert_state_equal(sk.read(tmp_path / "run"), expected)


def test_lightning_and_accelerate_to_statekeeper(
    tmp_path: Path,
    lightning: tuple[Path, dict[str, Any]],
    accelerate: tuple[Path, dict[str, Any]],
) -> None:
    for name, (source, _) in (("pl", lightning), ("acc", accelerate)):
        result = sk.conversion.convert(source, tmp_path / name)
        assert result.wrapped_as is None
        assert sk.audit.diff(source, tmp_path / name).equal  # every tensor, array and value
    assert_state_equal(dict(sk.read(tmp_path / "pl")["state_dict"]), lightning[1])
    converted = sk.read(tmp_path / "acc")
    assert set(converted) == {"model", "optimizer", "scheduler", "random_states_0"}
    assert_state_equal(converted["model"], accelerate[1]["model"])
    assert_state_equal(converted["optimizer"], accelerate[1]["optimizer"])


def test_statekeeper_to_one_safetensors_file(tmp_path: Path) -> None:
    model = formats.TiedLM()
    sk.save(tmp_path / "run", {"model": model, "epoch": 3, "cfg": {"lr": 0.1}}, step=1)
    out = tmp_path / "all.safetensors"
    result = sk.conversion.convert(tmp_path / "run", out)
    assert result.kind == "safetensors" and result.source_format == "statekeeper"
    assert result.dropped == ("epoch", "cfg.lr")
    assert result.aliases == {"model.lm_head.weight": "model.embed.weight"}
    with safe_open(str(out), framework="pt") as f:  # the reference reader
        assert set(f.keys()) == {"model.embed.weight", "model.mix.weight", "model.mix.bias"}
    read = sk.read(out)
    assert torch.equal(read["model.lm_head.weight"], model.embed.weight.detach())
    only_model = tmp_path / "model.safetensors"
    sk.conversion.convert(tmp_path / "run", only_model, key="model")
    assert sk.audit.diff(only_model, tmp_path / "run", key="model").equal


def test_existing_step_is_refused_unless_overwrite(tmp_path: Path) -> None:
    source = formats.safetensors_file(tmp_path / "w.safetensors", formats.weights())
    sk.conversion.convert(source, tmp_path / "run")
    with pytest.raises(sk.errors.StepExistsError):
        sk.conversion.convert(source, tmp_path / "run")
    sk.conversion.convert(source, tmp_path / "run", overwrite=True)


def test_unsafe_source_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("hi",))

    path = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(sk.errors.UnsafePickleError, match=r"builtins\.print"):
        sk.conversion.convert(path, tmp_path / "run")
    assert not (tmp_path / "run").exists()
