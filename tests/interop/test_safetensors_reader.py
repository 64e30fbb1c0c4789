"""Foreign safetensors files go through the core's one reader, plus their own limits."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import safetensors.torch
import torch

import statekeeper as sk
from statekeeper.format.safetensors_io import parse
from statekeeper.interop.safetensors_files import (
    MAX_DIMS,
    read_metadata,
    read_safetensors,
    write_safetensors,
)


def _file(path: Path, header: dict[str, object], data: bytes = b"") -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def test_reads_what_the_core_reads(tmp_path: Path) -> None:
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.int8)}
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
    foreign, core = read_safetensors(path), parse(bytearray(path.read_bytes()))
    assert set(foreign) == set(core) == set(tensors)
    for name, t in tensors.items():
        assert torch.equal(foreign[name], t) and torch.equal(core[name], t)
    assert read_metadata(path) == {"format": "pt"}


def test_core_refusals_name_the_foreign_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    entry = {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}
    gap = _file(tmp_path / "gap.safetensors", {"a": entry}, b"\0" * 8)
    refusals = {empty: "shorter than the 8-byte header length", gap: "overlaps or leaves gaps"}
    for path, words in refusals.items():
        with pytest.raises(sk.CorruptCheckpointError, match="not a valid safetensors file") as info:
            sk.read(path)
        assert info.value.path == str(path) and words in str(info.value)


def test_foreign_limits_come_on_top(tmp_path: Path) -> None:
    entry = {"dtype": "U8", "shape": [1] * (MAX_DIMS + 1), "data_offsets": [0, 1]}
    deep = _file(tmp_path / "deep.safetensors", {"a": entry}, b"\0")
    with pytest.raises(sk.CorruptCheckpointError, match="invalid shape"):
        sk.read(deep)
    assert parse(bytearray(deep.read_bytes()))["a"].dim() == MAX_DIMS + 1  # the core allows it
    meta = _file(tmp_path / "meta.safetensors", {"__metadata__": {"n": 1}})
    with pytest.raises(sk.CorruptCheckpointError, match="__metadata__ is not a map of strings"):
        sk.read(meta)


def test_tied_tensors_are_written_once_and_read_back_tied(tmp_path: Path) -> None:
    w = torch.randn(3, 3)
    path = tmp_path / "tied.safetensors"
    write_safetensors(path, {"emb": w}, aliases={"head": "emb"})
    back = read_safetensors(path)
    assert back["head"] is back["emb"] and torch.equal(back["emb"], w)
    assert [p.name for p in tmp_path.iterdir()] == ["tied.safetensors"]
