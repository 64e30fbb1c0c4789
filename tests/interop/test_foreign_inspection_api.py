"""``inspect`` and ``verify`` called from Python on foreign checkpoints: ``inspect`` reads
them safely into a typed report, ``verify`` refuses them by name (they carry no checksums)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tests.interop import formats

import statekeeper as sk
from statekeeper.catalog.verify import verify, verify_targets
from statekeeper.errors import InvalidArgumentError, UnsafePickleError
from statekeeper.interop import inspection
from statekeeper.interop.foreign_report import ForeignReport
from statekeeper.interop.inspection import inspect


def test_inspect_of_a_torch_file_is_a_foreign_report_with_ties_and_values(tmp_path: Path) -> None:
    model = formats.TiedLM()
    path = formats.torch_file(tmp_path / "lm.pt", {"model": model.state_dict(), "epoch": 5})
    report = inspect(path)
    assert isinstance(report, ForeignReport) and inspection.ForeignReport is ForeignReport
    assert (report.path, report.format) == (str(path), "torch")
    tensors = {t.key: t for t in report.tensors}
    embed, head = tensors["model.embed.weight"], tensors["model.lm_head.weight"]
    assert (embed.shape, embed.dtype, embed.alias_of) == ((7, 4), "float32", None)
    assert (head.bytes, head.alias_of) == (0, "model.embed.weight")
    assert [(v.key, v.type, v.value) for v in report.values] == [("epoch", "int", "5")]
    assert [(f.name, f.bytes) for f in report.files] == [("lm.pt", path.stat().st_size)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.format = "safetensors"


def test_inspect_of_safetensors_and_foreign_folders(tmp_path: Path) -> None:
    weights = formats.weights()
    single = inspect(formats.safetensors_file(tmp_path / "w.safetensors", weights))
    assert isinstance(single, ForeignReport) and single.format == "safetensors"
    assert {t.key for t in single.tensors} == set(weights)
    assert single.tensor_bytes == sum(t.numel() * t.element_size() for t in weights.values())
    hf = inspect(formats.hf_folder(tmp_path / "hf", weights))
    assert isinstance(hf, ForeignReport) and hf.format == "huggingface"
    assert [f.role for f in hf.files] == ["index", "weights", "weights"]


def test_inspect_refuses_what_it_cannot_read_safely(tmp_path: Path) -> None:
    path = formats.torch_file(tmp_path / "w.pt", {"w": torch.ones(2)})
    with pytest.raises(InvalidArgumentError, match="is a torch checkpoint, which has no steps"):
        inspect(path, step=3)
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hook": print}, evil)
    with pytest.raises(UnsafePickleError, match=r"builtins\.print"):
        inspect(evil)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InvalidArgumentError, match="not a checkpoint format"):
        inspect(tmp_path / "notes.txt")


def test_verify_refuses_foreign_checkpoints_by_name(tmp_path: Path) -> None:
    path = formats.torch_file(tmp_path / "w.pt", {"w": torch.ones(2)})
    hf = formats.hf_folder(tmp_path / "hf", formats.weights())
    for target, kind in ((path, "torch"), (hf, "huggingface")):
        with pytest.raises(InvalidArgumentError, match=f"is a {kind} checkpoint, not a state"):
            verify(target)
        with pytest.raises(InvalidArgumentError, match="statekeeper convert"):
            verify_targets(target)


def test_converted_foreign_checkpoint_verifies(tmp_path: Path) -> None:
    path = formats.safetensors_file(tmp_path / "w.safetensors", formats.weights())
    sk.conversion.convert(path, tmp_path / "run", out_step=3)
    report = verify(tmp_path / "run")
    assert report.ok and [s.step for s in report.steps] == [3]
