"""`statekeeper convert`: foreign formats into statekeeper runs, runs into safetensors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import Result
from tests.interop import formats

import statekeeper as sk
from statekeeper.testing import assert_state_equal

Invoke = Callable[..., Result]


def test_torch_file_into_a_run(invoke: Invoke, tmp_path: Path) -> None:
    model, opt = formats.trained()
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 4}
    source = formats.torch_file(tmp_path / "ckpt.pth", state, legacy=True)
    result = invoke("convert", source, "-o", tmp_path / "run", "--out-step", "7")
    assert result.exit_code == 0, result.output
    assert "(torch) -> step 7" in result.stdout and "entries: model, opt, epoch" in result.stdout
    assert_state_equal(sk.read(tmp_path / "run"), state)
    again = invoke("convert", source, "-o", tmp_path / "run", "--out-step", "7")
    assert again.exit_code == 1 and "already committed" in again.stderr
    replaced = invoke("convert", source, "-o", tmp_path / "run", "--out-step", "7", "--overwrite")
    assert replaced.exit_code == 0


def test_dcp_into_a_run_json(invoke: Invoke, tmp_path: Path) -> None:
    model = formats.net()
    source = formats.dcp_folder(tmp_path / "dcp", {"model": model.state_dict()})
    result = invoke("convert", source, "-o", tmp_path / "run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["source_format"] == "dcp" and data["kind"] == "statekeeper"
    assert data["entries"] == ["model"] and data["tensors"] == 7
    assert_state_equal(sk.read(tmp_path / "run")["model"], dict(model.state_dict()))


def test_run_into_one_safetensors_file(invoke: Invoke, tmp_path: Path) -> None:
    model = formats.TiedLM()
    sk.save(tmp_path / "run", {"model": model, "epoch": 1}, step=3)
    out = tmp_path / "out.safetensors"
    result = invoke("convert", tmp_path / "run", "-o", out)
    assert result.exit_code == 0, result.output
    assert "alias: model.lm_head.weight -> model.embed.weight" in result.stdout
    assert "dropped 1 non-tensor value(s): epoch" in result.stdout
    read = sk.read(out)
    assert torch.equal(read["model.mix.weight"], model.mix.weight.detach())


def test_unsafe_and_truncated_inputs(invoke: Invoke, tmp_path: Path) -> None:
    whole = formats.torch_file(tmp_path / "w.pt", formats.weights())
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole.read_bytes()[:100])
    result = invoke("convert", cut, "-o", tmp_path / "run")
    assert result.exit_code == 1
    assert f"{cut}: truncated or damaged torch.save file" in result.stderr
    assert not (tmp_path / "run").exists()


def test_existing_safetensors_file_is_not_replaced_without_overwrite(
    invoke: Invoke, tmp_path: Path
) -> None:
    source = formats.torch_file(tmp_path / "w.pt", formats.weights())
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"precious")
    result = invoke("convert", source, "-o", out)
    assert result.exit_code == 1
    assert str(out) in result.stderr and "--overwrite" in result.stderr
    assert out.read_bytes() == b"precious"
    with pytest.raises(sk.errors.OutputExistsError, match="already exists") as info:
        sk.conversion.convert(source, out)
    assert isinstance(info.value, FileExistsError) and info.value.path == str(out)
    assert not isinstance(info.value, sk.errors.StepExistsError)  # a file, not a step
    assert "overwrite=True" in str(info.value) and "--" not in str(info.value)
    assert out.read_bytes() == b"precious"
    assert invoke("convert", source, "-o", out, "--overwrite").exit_code == 0
    assert_state_equal(sk.read(out), formats.weights())
    sk.conversion.convert(source, out, overwrite=True)
    assert_state_equal(sk.read(out), formats.weights())
