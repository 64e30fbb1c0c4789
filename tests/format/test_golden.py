"""Golden files pin the bytes of format version 1: old checkpoints stay loadable forever."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import sys
from collections import OrderedDict
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch
import xxhash
from tests.helpers.orders import assert_same_in_order

import statekeeper
from statekeeper.checkpoint.writer import write_step
from statekeeper.storage.local import LocalStorage

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
STEP_DIR = GOLDEN / "v1" / "step_000000007"
SHARD = "tensors-00000.safetensors"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_golden", module)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _manifest() -> dict[str, Any]:
    return json.loads((STEP_DIR / "manifest.json").read_bytes())


def assert_same(actual: Any, expected: Any) -> None:
    """Exact equality (statekeeper.testing's bitwise comparison: tuple is not list,
    OrderedDict is not dict, same bits) with the same key orders and state_dict metadata."""
    assert_same_in_order(actual, expected)


# (a) the generator reproduces the committed bytes ---------------------------------------------


def test_golden_files_are_committed() -> None:
    assert sorted(p.name for p in STEP_DIR.iterdir()) == ["manifest.json", SHARD]
    assert sorted(p.name for p in STEP_DIR.parent.iterdir()) == ["step_000000007"]


def test_regenerating_gives_identical_bytes(tmp_path: Path) -> None:
    step_dir = gen.write_golden(tmp_path)
    assert step_dir == tmp_path / "step_000000007"
    fresh, golden = _tree(tmp_path), _tree(STEP_DIR.parent)
    assert sorted(fresh) == sorted(golden)  # no lock file, no leftover partial directory
    for name, data in golden.items():
        assert fresh[name] == data, f"{name} differs from the golden file"


# (b) the committed checkpoint loads and equals the expected state ----------------------------


@pytest.fixture(scope="module")
def loaded() -> dict[str, Any]:
    return statekeeper.read(STEP_DIR)


def test_golden_state_equals_expected(loaded: dict[str, Any]) -> None:
    assert_same(loaded, gen.build_state())


def test_read_from_run_directory_by_step() -> None:
    assert_same(statekeeper.read(STEP_DIR.parent, step=7), gen.build_state())


def test_golden_values_spot_checks(loaded: dict[str, Any]) -> None:
    # independent of the generator: what the bytes must decode to
    scalars, containers = loaded["scalars"], loaded["containers"]
    assert scalars["huge"] == 1180591620717411303425 and type(scalars["huge"]) is int
    assert scalars["huge_negative"] == -1208925819614629174706179
    assert (
        math.isnan(scalars["nan"])
        and scalars["inf"] == math.inf
        and scalars["neg_inf"] == -math.inf
    )
    assert math.copysign(1.0, scalars["neg_zero"]) == -1.0
    assert scalars["text"] == "h\u00e9llo \u2713 \u65e5\u672c \U0001f680"
    assert scalars["bytes"] == b"\x00\x01\xfe\xffstatekeeper"
    assert scalars["complex"] == complex(1.5, -2.25)
    assert containers["tuple"] == (1, "two", 3.0) and type(containers["tuple"]) is tuple
    assert containers["list"] == [1, "two", 3.0] and type(containers["list"]) is list
    assert containers["int_keys"] == {1: "one", 2: "two", -3: "minus three"}
    assert containers["dollar_keys"] == {"$tensor": "not a reference", "plain": 2}
    assert containers["tuple_keys"] == {(1, "a"): "tuple key"}
    values = loaded["torch_values"]
    assert values["dtype"] is torch.bfloat16 and values["dtypes"][1] is torch.float8_e4m3fn
    assert type(values["size"]) is torch.Size and values["size"] == (2, 3)
    assert values["device"] == torch.device("cpu")
    numpy = loaded["numpy"]
    assert type(numpy["float32"]) is np.float32 and numpy["float32"] == np.float32(0.1)
    assert type(numpy["int64"]) is np.int64 and numpy["int64"] == -(2**40)
    assert type(numpy["bool"]) is np.bool_ and bool(numpy["bool"])
    assert numpy["array"].dtype == np.float64 and numpy["array"][1, 1] == 2.0**-1074
    tensors = loaded["tensors"]
    assert {k: t.dtype for k, t in tensors.items() if k not in ("scalar", "empty", "expanded")} == {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float8_e4m3fn": torch.float8_e4m3fn,
        "int64": torch.int64,
        "uint8": torch.uint8,
        "bool": torch.bool,
    }
    assert tensors["scalar"].shape == () and tensors["scalar"].item() == 2.5
    assert tensors["empty"].shape == (0, 3)
    assert tensors["int64"].tolist() == [0, -1, 2**62, -(2**63)]
    assert tensors["float8_e4m3fn"].float().tolist() == [0.5, -448.0, 1.75]
    assert tensors["float32"].isnan().tolist() == [[False, False], [True, False], [False, False]]
    assert loaded["same_path"] == {1: torch.tensor([1]), "1": torch.tensor([2])}


def test_module_state_keeps_order_and_metadata(loaded: dict[str, Any]) -> None:
    model = loaded["model"]
    fresh = gen.GoldenNet().state_dict()
    assert type(model) is OrderedDict and list(model) == list(fresh)
    # (typing) torch's state_dict metadata attribute
    assert model._metadata == fresh._metadata  # type: ignore[attr-defined]
    net = gen.GoldenNet()
    net.load_state_dict(model)  # strict, _metadata-aware load of the real module
    assert_same(net.state_dict(), gen.golden_module().state_dict())


def test_tied_pair_shares_memory_again() -> None:
    loaded = statekeeper.read(STEP_DIR)  # a fresh copy: this test writes into it
    embed, head = loaded["model"]["embed.weight"], loaded["model"]["head.weight"]
    assert embed.data_ptr() == head.data_ptr()
    assert embed.stride() == head.stride() and embed.shape == head.shape
    embed[0, 0] = 123.0
    assert head[0, 0].item() == 123.0


def test_slice_is_a_view_of_its_base() -> None:
    loaded = statekeeper.read(STEP_DIR)  # a fresh copy: this test writes into it
    base, view = loaded["views"]["base"], loaded["views"]["slice"]
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert view.storage_offset() - base.storage_offset() == 4
    assert view.stride() == (4, 2) and view.shape == (2, 2)
    base[2, 2] = -1.0
    assert view[1, 1].item() == -1.0


def test_disjoint_views_share_a_stored_span(loaded: dict[str, Any]) -> None:
    head, tail = loaded["storage"]["head"], loaded["storage"]["tail"]
    assert head.untyped_storage().data_ptr() == tail.untyped_storage().data_ptr()
    assert tail.storage_offset() - head.storage_offset() == 6
    assert head.tolist() == [0, 1, 2] and tail.tolist() == [6, 7, 8, 9]
    assert list(loaded["storage"]) == ["head", "tail"]  # the stored span is not part of the state


def test_expanded_tensor_is_materialized(loaded: dict[str, Any]) -> None:
    expanded = loaded["tensors"]["expanded"]
    assert expanded.stride() == (3, 1)
    assert torch._debug_has_internal_overlap(expanded) == 0


# (c) the shard is a standard safetensors file ---------------------------------------------------


def test_shard_opens_with_plain_safe_open() -> None:
    manifest = _manifest()
    records = manifest["tensors"]
    with safetensors.safe_open(str(STEP_DIR / SHARD), framework="pt") as f:
        assert f.metadata() is None
        keys = sorted(f.keys())
        assert keys == sorted(n for n, r in records.items() if r["file"] == SHARD)
        assert keys == sorted(records)  # aliases are not stored
        assert not set(keys) & set(manifest["aliases"])
        for name in keys:
            t = f.get_tensor(name)
            assert str(t.dtype).removeprefix("torch.") == records[name]["dtype"], name
            assert list(t.shape) == records[name]["shape"], name
            assert f.get_slice(name).get_shape() == records[name]["shape"], name


def test_shard_header_uses_safetensors_dtype_names() -> None:
    data = (STEP_DIR / SHARD).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    assert n % 8 == 0 and "__metadata__" not in header
    names = {v: k for k, v in safetensors.torch._TYPES.items()}
    for name, record in _manifest()["tensors"].items():
        assert header[name]["dtype"] == names[getattr(torch, record["dtype"])], name
        assert header[name]["shape"] == record["shape"], name
    ends = sorted(v["data_offsets"][1] for v in header.values())
    assert ends[-1] == len(data) - 8 - n


# (e) a reader in another language can verify the files with json + xxh3_128 alone -------------


def test_independent_verification_as_documented() -> None:
    raw = (STEP_DIR / "manifest.json").read_bytes()
    text = raw.decode("ascii")
    assert text.endswith("\n}\n") and text.startswith("{\n")
    body = json.loads(text)
    assert list(body) == [
        "format",
        "version",
        "step",
        "created",
        "library",
        "metrics",
        "files",
        "tensors",
        "aliases",
        "state",
        "manifest_checksum",
    ]
    assert (body["format"], body["version"], body["step"]) == ("statekeeper", 1, 7)
    algorithm, digest = body["manifest_checksum"].split(":")
    key = '"manifest_checksum":"xxh3_128:'
    at = text.rindex(key) + len(key)
    assert text[at : at + 32] == digest
    zeroed = text[:at] + "0" * 32 + text[at + 32 :]
    assert algorithm == "xxh3_128" and xxhash.xxh3_128_hexdigest(zeroed.encode()) == digest
    for name, record in body["files"].items():
        data = (STEP_DIR / name).read_bytes()
        assert len(data) == record["size"]
        assert record["checksum"] == "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)


# (d) saving the same state twice is deterministic ----------------------------------------------


def test_saving_twice_gives_identical_bytes_but_created(tmp_path: Path) -> None:
    first = statekeeper.save(tmp_path / "a", gen.build_state(), step=7, metrics=gen.METRICS)
    second = statekeeper.save(tmp_path / "b", gen.build_state(), step=7, metrics=gen.METRICS)
    a, b = Path(first.path), Path(second.path)
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    assert (a / SHARD).read_bytes() == (b / SHARD).read_bytes() == (STEP_DIR / SHARD).read_bytes()
    lines_a = (a / "manifest.json").read_bytes().split(b"\n")
    lines_b = (b / "manifest.json").read_bytes().split(b"\n")
    assert len(lines_a) == len(lines_b)
    differing = {la.split(b":", 1)[0] for la, lb in zip(lines_a, lines_b, strict=True) if la != lb}
    assert differing <= {b'"created"', b'"manifest_checksum"'}
    assert (b'"created"' in differing) == (b'"manifest_checksum"' in differing)


def test_same_created_gives_identical_manifest(tmp_path: Path) -> None:
    for run in ("a", "b"):
        write_step(
            LocalStorage(tmp_path / run),
            gen.build_state(),
            step=7,
            metrics=gen.METRICS,
            created="2030-05-06T07:08:09.000010Z",
            library={"statekeeper": "x"},
        )
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    manifest = (tmp_path / "a" / "step_000000007" / "manifest.json").read_bytes()
    assert b'\n"created":"2030-05-06T07:08:09.000010Z",\n' in manifest
