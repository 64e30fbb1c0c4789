"""Every foreign format is read by statekeeper.read into plain CPU tensors equal to what was
saved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.interop import formats

import statekeeper as sk
from statekeeper.catalog.detect import Format, detect
from statekeeper.testing import assert_state_equal


def test_torch_zip_and_legacy_files(tmp_path: Path) -> None:
    model, opt = formats.trained()
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 3, "name": "x"}
    for legacy in (False, True):
        path = formats.torch_file(tmp_path / f"ckpt-{legacy}.pt", state, legacy=legacy)
        assert detect(path) is Format.TORCH
        assert_state_equal(sk.read(path), state)


def test_torch_file_keeps_shared_storage(tmp_path: Path) -> None:
    model = formats.TiedLM()
    path = formats.torch_file(tmp_path / "tied.pth", model.state_dict())
    read = sk.read(path)
    assert read["lm_head.weight"].data_ptr() == read["embed.weight"].data_ptr()


def test_torch_file_holding_a_bare_tensor(tmp_path: Path) -> None:
    path = formats.torch_file(tmp_path / "t.bin", torch.arange(3))
    assert torch.equal(sk.read(path)["state"], torch.arange(3))


def test_safetensors_file(tmp_path: Path) -> None:
    tensors = formats.weights()
    path = formats.safetensors_file(tmp_path / "model.safetensors", tensors)
    assert detect(path) is Format.SAFETENSORS
    assert_state_equal(sk.read(path), tensors)


@pytest.mark.parametrize("safe", [True, False])
def test_sharded_hugging_face_folder_and_index(tmp_path: Path, safe: bool) -> None:
    tensors = formats.weights()
    folder = formats.hf_folder(tmp_path / "hf", tensors, safe=safe)
    index = next(folder.glob("*.index.json"))
    assert len(set(json.loads(index.read_text())["weight_map"].values())) > 1  # really sharded
    for path in (folder, index):
        assert detect(path) is Format.HUGGINGFACE
        read = sk.read(path)
        assert list(read) == list(json.loads(index.read_text())["weight_map"])
        assert_state_equal(read, tensors)


def test_index_naming_a_missing_shard_is_corrupt(tmp_path: Path) -> None:
    folder = formats.hf_folder(tmp_path / "hf", formats.weights())
    shard = sorted(folder.glob("*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(sk.CorruptCheckpointError, match=shard.name):
        sk.read(folder)


def test_dcp_folder(tmp_path: Path) -> None:
    model = formats.net()
    state: dict[str, Any] = {
        "model": model.state_dict(),
        "extra": {"step": 7, "name": "dcp", "big": torch.arange(12.0).reshape(3, 4)},
    }
    expected = {
        "model": {k: v.clone() for k, v in state["model"].items()},
        "extra": {"step": 7, "name": "dcp", "big": torch.arange(12.0).reshape(3, 4)},
    }
    folder = formats.dcp_folder(tmp_path / "dcp", state)
    assert detect(folder) is Format.DCP
    assert_state_equal(sk.read(folder), expected)


def test_dcp_optimizer_state_comes_back_as_dcp_rebuilds_it(tmp_path: Path) -> None:
    _, opt = formats.trained()
    folder = formats.dcp_folder(tmp_path / "dcp", {"opt": opt.state_dict()})
    read = sk.read(folder)["opt"]
    # DCP's flattening turns dict keys into strings and keeps list indices (as its own
    # dcp_to_torch_save rebuilds them)
    for i, state in opt.state_dict()["state"].items():
        assert_state_equal(read["state"][str(i)], state)
    assert isinstance(read["param_groups"], list)
    assert read["param_groups"][0]["lr"] == 0.01


def test_lightning_checkpoint(lightning: tuple[Path, dict[str, Any]]) -> None:
    path, module_state = lightning
    assert detect(path) is Format.LIGHTNING
    read = sk.read(path)
    assert read["global_step"] == 1 and "pytorch-lightning_version" in read
    assert_state_equal(dict(read["state_dict"]), module_state)
    assert read["optimizer_states"][0]["state"][0]["exp_avg"].shape == (3, 4)


def test_accelerate_folder(accelerate: tuple[Path, dict[str, Any]]) -> None:
    folder, expected = accelerate
    assert detect(folder) is Format.ACCELERATE
    read = sk.read(folder)
    assert set(read) == {"model", "optimizer", "scheduler", "random_states_0"}
    assert_state_equal(read["model"], expected["model"])
    assert_state_equal(read["optimizer"], expected["optimizer"])
    assert read["scheduler"]["last_epoch"] == expected["scheduler"]["last_epoch"] == 1
    rng = read["random_states_0"]
    assert isinstance(rng["numpy_random_seed"][1], np.ndarray)  # numpy allowed for RNG files
    assert torch.equal(rng["torch_manual_seed"], rng["torch_manual_seed"])


def test_statekeeper_directories_still_read_as_before(tmp_path: Path) -> None:
    model = formats.net()
    sk.save(tmp_path / "run", {"model": model}, step=3)
    assert detect(tmp_path / "run") is Format.STATEKEEPER
    assert_state_equal(sk.read(tmp_path / "run")["model"], model.state_dict())
    with pytest.raises(sk.StepNotFoundError):
        sk.read(tmp_path / "empty-run")


def test_step_is_refused_for_foreign_formats(tmp_path: Path) -> None:
    path = formats.safetensors_file(tmp_path / "m.safetensors", formats.weights())
    with pytest.raises(sk.errors.InvalidArgumentError, match="has no steps"):
        sk.read(path, step=1)


def test_unknown_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(
        sk.errors.InvalidArgumentError, match=r"notes\.txt: not a checkpoint format"
    ):
        sk.read(tmp_path / "notes.txt")
    (tmp_path / "weights.pt").write_text("hello")
    with pytest.raises(sk.CorruptCheckpointError, match=r"weights\.pt"):
        sk.read(tmp_path / "weights.pt")
