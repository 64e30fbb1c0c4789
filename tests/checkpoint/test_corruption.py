"""Every kind of damage to a committed step is detected, named, and leaves live objects alone.

Each case writes a damaged copy of one small checkpoint (an ``nn.Linear(8, 8)`` and its Adam
optimizer), then checks that ``statekeeper.load`` raises CorruptCheckpointError or
UnsupportedFormatError whose message names the damaged file, that the live module and
optimizer are bitwise unchanged, and that ``statekeeper.read`` raises the same error.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from tests.helpers.orders import assert_same_in_order

import statekeeper
from statekeeper.errors import CorruptCheckpointError, UnsupportedFormatError
from statekeeper.format.checksum import checksum
from statekeeper.format.manifest import FileRecord, Manifest

MANIFEST = "manifest.json"
SHARD = "tensors-00000.safetensors"
ENTRY = "step_000000001"
CHECKSUM_KEY = '"manifest_checksum":"xxh3_128:'

_rng = random.Random(20260101)


def _flips(region: str, wheres: list[float], bits: list[int]) -> list[Any]:
    return [
        pytest.param(region, w, b, id=f"{region}-{i:02d}-bit{b}")
        for i, (w, b) in enumerate(zip(wheres, bits, strict=True))
    ]


# (region, where in the region: a fraction of it or a byte index, bit)
SHARD_FLIPS = (
    _flips("length", list(range(8)), [_rng.randrange(8) for _ in range(8)])
    + _flips("header", [_rng.random() for _ in range(24)], [_rng.randrange(8) for _ in range(24)])
    + _flips("data", [_rng.random() for _ in range(24)], [_rng.randrange(8) for _ in range(24)])
)
MANIFEST_FLIPS = [
    *_flips("file", [_rng.random() for _ in range(56)], [_rng.randrange(8) for _ in range(56)]),
    pytest.param("version", 0, 1, id="version-bit1"),  # "1" -> "3": an unsupported version
    pytest.param("version", 0, 0, id="version-bit0"),  # "1" -> "0"
    pytest.param("checksum", 0, 0, id="checksum-first-digit"),
    pytest.param("checksum", 31, 5, id="checksum-last-digit"),
    pytest.param("end", 0, 0, id="trailing-newline"),
]


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Linear, torch.optim.Adam]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(2, 8)).square().sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    run = tmp_path_factory.mktemp("pristine")
    model, opt = _model_and_optimizer(0)
    statekeeper.save(run, {"model": model, "optim": opt}, step=1)
    step = run / ENTRY
    files = {p.name: p.read_bytes() for p in step.iterdir()}
    assert sorted(files) == [MANIFEST, SHARD]
    return files


def _write_run(root: Path, files: dict[str, bytes]) -> Path:
    run = root / "run"
    (run / ENTRY).mkdir(parents=True)
    for name, data in files.items():
        (run / ENTRY / name).write_bytes(data)
    return run


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
    return copy.deepcopy((model.state_dict(), opt.state_dict()))


def assert_rejected(run: Path, damaged: str) -> CorruptCheckpointError | UnsupportedFormatError:
    """Load and read both fail naming ``damaged``; the live objects are untouched."""
    model, opt = _model_and_optimizer(1)  # live state that differs from the checkpoint
    before = _snapshot(model, opt)
    with pytest.raises((CorruptCheckpointError, UnsupportedFormatError)) as info:
        statekeeper.load(run, {"model": model, "optim": opt})
    error = info.value
    path = str(run / ENTRY / damaged)
    # (typing) every CheckpointUnreadableError the test provokes is one of these, with a path
    assert error.path == path  # type: ignore[attr-defined]
    assert str(error).startswith(f"{path}: ")
    assert_same_in_order(_snapshot(model, opt), before)
    with pytest.raises(type(error)) as again:
        statekeeper.read(run)
    assert str(again.value) == str(error)
    # (typing) every CheckpointUnreadableError the test provokes is one of these, with a path
    return error  # type: ignore[return-value]


def _flip(data: bytes, position: int, bit: int) -> bytes:
    damaged = bytearray(data)
    damaged[position] ^= 1 << bit
    return bytes(damaged)


def _resign(text: str) -> bytes:
    """Recompute manifest_checksum, so that only the intended change is left."""
    at = text.rindex(CHECKSUM_KEY) + len(CHECKSUM_KEY)
    zeroed = text[:at] + "0" * 32 + text[at + 32 :]
    return (
        text[:at] + xxhash.xxh3_128_hexdigest(zeroed.encode("ascii")) + text[at + 32 :]
    ).encode()


def _members(text: str) -> list[str]:
    """The top-level members of a manifest, each as its (possibly multi-line) text."""
    assert text.startswith("{\n") and text.endswith("\n}\n")
    return re.split(r',\n(?=")', text[2:-3])


def _join(members: list[str]) -> str:
    return "{\n" + ",\n".join(members) + "\n}\n"


def _with_shard(pristine: dict[str, bytes], shard: bytes, *, resign: bool) -> dict[str, bytes]:
    """``pristine`` with its shard replaced; with ``resign`` the manifest vouches for it."""
    files = {**pristine, SHARD: shard}
    if resign:
        manifest = Manifest.from_bytes(MANIFEST, pristine[MANIFEST])
        record = FileRecord(len(shard), checksum(shard))
        files[MANIFEST] = dataclasses.replace(manifest, files={SHARD: record}).to_bytes()
    return files


# the pristine checkpoint and the helpers ---------------------------------------------------------


def test_pristine_checkpoint_loads_and_changes_the_live_objects(
    tmp_path: Path, pristine: dict[str, bytes]
) -> None:
    run = _write_run(tmp_path, pristine)
    model, opt = _model_and_optimizer(1)
    before = _snapshot(model, opt)
    statekeeper.load(run, {"model": model, "optim": opt})
    with pytest.raises(AssertionError):
        assert_same_in_order(_snapshot(model, opt), before)  # so "untouched" below means something
    saved_model, saved_opt = _model_and_optimizer(0)
    assert_same_in_order(_snapshot(model, opt), _snapshot(saved_model, saved_opt))


def test_manifest_helpers_round_trip(pristine: dict[str, bytes]) -> None:
    text = pristine[MANIFEST].decode("ascii")
    assert _resign(text) == pristine[MANIFEST]
    assert _join(_members(text)) == text
    assert [m.split(":", 1)[0] for m in _members(text)] == [
        '"format"',
        '"version"',
        '"step"',
        '"created"',
        '"library"',
        '"origin"',  # where it was written: informational, optional
        '"metrics"',
        '"files"',
        '"tensors"',
        '"aliases"',
        '"state"',
        '"manifest_checksum"',
    ]
    manifest = Manifest.from_bytes(MANIFEST, pristine[MANIFEST])
    assert manifest.to_bytes() == pristine[MANIFEST]
    assert _with_shard(pristine, pristine[SHARD], resign=True) == pristine


# bit flips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("region", "where", "bit"), SHARD_FLIPS)
def test_bit_flip_in_shard(
    tmp_path: Path, pristine: dict[str, bytes], region: str, where: float, bit: int
) -> None:
    data = pristine[SHARD]
    (header_len,) = struct.unpack("<Q", data[:8])
    if region == "length":
        position = int(where)
    elif region == "header":
        position = 8 + int(where * header_len)
    else:
        position = 8 + header_len + int(where * (len(data) - 8 - header_len))
    run = _write_run(tmp_path, {**pristine, SHARD: _flip(data, position, bit)})
    error = assert_rejected(run, SHARD)
    assert "checksum mismatch" in str(error)


@pytest.mark.parametrize(("region", "where", "bit"), MANIFEST_FLIPS)
def test_bit_flip_in_manifest(
    tmp_path: Path, pristine: dict[str, bytes], region: str, where: float, bit: int
) -> None:
    data = pristine[MANIFEST]
    text = data.decode("ascii")
    if region == "file":
        position = int(where * len(data))
    elif region == "version":
        position = text.index('"version":1') + len('"version":')
    elif region == "checksum":
        position = text.rindex(CHECKSUM_KEY) + len(CHECKSUM_KEY) + int(where)
    else:
        position = len(data) - 1
    run = _write_run(tmp_path, {**pristine, MANIFEST: _flip(data, position, bit)})
    assert_rejected(run, MANIFEST)


def test_flipped_version_digit_is_an_unsupported_version(
    tmp_path: Path, pristine: dict[str, bytes]
) -> None:
    text = pristine[MANIFEST].decode("ascii")
    position = text.index('"version":1') + len('"version":')
    run = _write_run(tmp_path, {**pristine, MANIFEST: _flip(pristine[MANIFEST], position, 1)})
    error = assert_rejected(run, MANIFEST)
    assert isinstance(error, UnsupportedFormatError) and error.found == 3


# truncation --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [MANIFEST, SHARD])
@pytest.mark.parametrize("length", ["zero", "one", "half", "all but one"])
def test_truncated_file(tmp_path: Path, pristine: dict[str, bytes], name: str, length: str) -> None:
    data = pristine[name]
    keep = {"zero": 0, "one": 1, "half": len(data) // 2, "all but one": len(data) - 1}[length]
    run = _write_run(tmp_path, {**pristine, name: data[:keep]})
    error = assert_rejected(run, name)
    if name == SHARD:
        assert f"size is {keep} bytes, the manifest says {len(data)}" in str(error)


# safetensors header edits that keep the file's size ------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "resigned_problem"),
    [
        ('"dtype":"F32"', '"dtype":"F16"', "not a valid safetensors file"),  # sizes disagree
        ('"dtype":"F32"', '"dtype":"I32"', "differs from the manifest"),  # a valid file
        ('"shape":[8,8]', '"shape":[8,9]', "not a valid safetensors file"),
        ('"shape":[8,8]', '"shape":[4,8]', "not a valid safetensors file"),
    ],
)
@pytest.mark.parametrize("resign", [False, True], ids=["plain", "resigned"])
def test_header_edit_keeping_size(
    tmp_path: Path,
    pristine: dict[str, bytes],
    old: str,
    new: str,
    resigned_problem: str,
    resign: bool,
) -> None:
    data = pristine[SHARD]
    assert data.count(old.encode()) >= 1 and len(old) == len(new)
    edited = data.replace(old.encode(), new.encode(), 1)
    assert len(edited) == len(data) and edited != data
    run = _write_run(tmp_path, _with_shard(pristine, edited, resign=resign))
    error = assert_rejected(run, SHARD)
    assert (resigned_problem if resign else "checksum mismatch") in str(error)


def test_tensor_renamed_in_header(tmp_path: Path, pristine: dict[str, bytes]) -> None:
    # a valid safetensors file, and the manifest vouches for its bytes, but not for its names
    data = pristine[SHARD]
    edited = data.replace(b'"model/bias"', b'"model/BIAS"').replace(b'"optim/', b'"OPTIM/', 1)
    assert len(edited) == len(data) and edited != data
    run = _write_run(tmp_path, _with_shard(pristine, edited, resign=True))
    assert "is missing or differs from the manifest" in str(assert_rejected(run, SHARD))


# manifest damage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"format":"statekeeper",\n', "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"[1, 2, 3]\n", "not a JSON object"),
        (b'"statekeeper"\n', "not a JSON object"),
        (b"null\n", "not a JSON object"),
        (b"{}\n", "not a statekeeper manifest"),
    ],
    ids=["unterminated", "empty", "not-ascii", "array", "string", "null", "empty-object"],
)
def test_malformed_manifest(
    tmp_path: Path, pristine: dict[str, bytes], content: bytes, problem: str
) -> None:
    run = _write_run(tmp_path, {**pristine, MANIFEST: content})
    error = assert_rejected(run, MANIFEST)
    assert isinstance(error, CorruptCheckpointError) and problem in str(error)


def test_missing_manifest(tmp_path: Path, pristine: dict[str, bytes]) -> None:
    run = _write_run(tmp_path, {SHARD: pristine[SHARD]})
    assert "manifest.json is missing" in str(assert_rejected(run, MANIFEST))


def test_missing_shard(tmp_path: Path, pristine: dict[str, bytes]) -> None:
    run = _write_run(tmp_path, {MANIFEST: pristine[MANIFEST]})
    assert "file listed in the manifest is missing" in str(assert_rejected(run, SHARD))


@pytest.mark.parametrize("resign", [False, True], ids=["plain", "resigned"])
def test_wrong_format_name(tmp_path: Path, pristine: dict[str, bytes], resign: bool) -> None:
    text = pristine[MANIFEST].decode("ascii").replace('"format":"statekeeper"', '"format":"other"')
    content = _resign(text) if resign else text.encode()
    run = _write_run(tmp_path, {**pristine, MANIFEST: content})
    error = assert_rejected(run, MANIFEST)
    assert isinstance(error, CorruptCheckpointError) and "format='other'" in str(error)


@pytest.mark.parametrize("resign", [False, True], ids=["plain", "resigned"])
def test_version_3_is_unsupported(tmp_path: Path, pristine: dict[str, bytes], resign: bool) -> None:
    text = pristine[MANIFEST].decode("ascii").replace('\n"version":1,\n', '\n"version":3,\n')
    content = _resign(text) if resign else text.encode()
    run = _write_run(tmp_path, {**pristine, MANIFEST: content})
    error = assert_rejected(run, MANIFEST)
    assert isinstance(error, UnsupportedFormatError)
    assert error.found == 3 and error.supported == (1, 2)
    assert "format version 3 is not supported (this release reads 1, 2)" in str(error)


@pytest.mark.parametrize("resign", [False, True], ids=["plain", "resigned"])
def test_version_2_without_its_members_is_corrupt(
    tmp_path: Path, pristine: dict[str, bytes], resign: bool
) -> None:
    text = pristine[MANIFEST].decode("ascii").replace('\n"version":1,\n', '\n"version":2,\n')
    content = _resign(text) if resign else text.encode()
    run = _write_run(tmp_path, {**pristine, MANIFEST: content})
    error = assert_rejected(run, MANIFEST)
    assert isinstance(error, CorruptCheckpointError)


@pytest.mark.parametrize(
    "member",
    [
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
    ],
)
@pytest.mark.parametrize("resign", [False, True], ids=["plain", "resigned"])
def test_member_deleted(
    tmp_path: Path, pristine: dict[str, bytes], member: str, resign: bool
) -> None:
    members = _members(pristine[MANIFEST].decode("ascii"))
    kept = [m for m in members if not m.startswith(f'"{member}":')]
    assert len(kept) == len(members) - 1
    text = _join(kept)
    content = _resign(text) if resign and member != "manifest_checksum" else text.encode()
    run = _write_run(tmp_path, {**pristine, MANIFEST: content})
    error = assert_rejected(run, MANIFEST)
    assert isinstance(error, UnsupportedFormatError) == (member == "version")


def _resigned_manifest(pristine: dict[str, bytes], **changes: Any) -> bytes:
    manifest = Manifest.from_bytes(MANIFEST, pristine[MANIFEST])
    return dataclasses.replace(manifest, **changes).to_bytes()


def test_file_record_deleted(tmp_path: Path, pristine: dict[str, bytes]) -> None:
    run = _write_run(tmp_path, {**pristine, MANIFEST: _resigned_manifest(pristine, files={})})
    assert "is in unlisted file" in str(assert_rejected(run, MANIFEST))


def test_tensor_record_deleted(tmp_path: Path, pristine: dict[str, bytes]) -> None:
    tensors = Manifest.from_bytes(MANIFEST, pristine[MANIFEST]).tensors
    fewer = {n: r for n, r in tensors.items() if n != "model/weight"}
    run = _write_run(tmp_path, {**pristine, MANIFEST: _resigned_manifest(pristine, tensors=fewer)})
    assert "reference to unknown tensor 'model/weight'" in str(assert_rejected(run, MANIFEST))


def test_tensor_record_with_wrong_shape(tmp_path: Path, pristine: dict[str, bytes]) -> None:
    tensors = dict(Manifest.from_bytes(MANIFEST, pristine[MANIFEST]).tensors)
    tensors["model/weight"] = tensors["model/weight"]._replace(shape=(64,))
    run = _write_run(
        tmp_path, {**pristine, MANIFEST: _resigned_manifest(pristine, tensors=tensors)}
    )
    assert "'model/weight' is missing or differs" in str(assert_rejected(run, SHARD))


def test_file_record_with_wrong_size(tmp_path: Path, pristine: dict[str, bytes]) -> None:
    record = FileRecord(len(pristine[SHARD]) + 1, checksum(pristine[SHARD]))
    manifest = _resigned_manifest(pristine, files={SHARD: record})
    run = _write_run(tmp_path, {**pristine, MANIFEST: manifest})
    assert "the manifest says" in str(assert_rejected(run, SHARD))
