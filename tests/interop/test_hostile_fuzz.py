"""Structure-aware fuzzing of the foreign JSON parsers: Hugging Face ``*.index.json`` files
and safetensors headers (with their ``__metadata__`` and ``aliases``).

Every input either reads or raises ``CorruptCheckpointError`` / ``UnsupportedFormatError``:
never ``RecursionError``, ``TypeError``, ``KeyError``, ``MemoryError`` or a hang. Inputs are
built from the shapes an attacker would reach for: deep nesting, huge and negative numbers,
odd JSON types where numbers or strings belong, long names, and file names that try to leave
the folder or name a FIFO or a device.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.interop import formats
from tests.interop.test_hostile_foreign import outcome

import statekeeper as sk

ALLOWED = (sk.CorruptCheckpointError, sk.errors.UnsupportedFormatError)
EXAMPLES = int(os.environ.get("SK_FUZZ_EXAMPLES", "150"))  # raise it to fuzz longer
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=16,
)


def _deep(n: int, opener: str, closed: bool) -> str:
    closer = {"[": "]", "{": "}"}[opener]
    if opener == "{":
        return '{"a":' * n + "0" + "}" * n if closed else '{"a":' * n
    return opener * n + (closer * n if closed else "")


DEEP_JSON = st.builds(
    _deep, st.integers(min_value=1, max_value=120_000), st.sampled_from("[{"), st.booleans()
)
FILE_NAMES = st.sampled_from(
    ["s.safetensors", "../s.safetensors", "/etc/passwd", "/dev/zero", "a/b", "", ".", "..",
     "x\x00y", "sub", "fifo.safetensors", "zero.safetensors", "loop.safetensors",
     "model.safetensors.index.json", "C:\\x", "é.safetensors", "a" * 300, "missing.bin"]
) | st.text(max_size=20)  # fmt: skip


def _index_doc(weight_map: Any, extra: dict[str, Any]) -> bytes:
    return json.dumps({**extra, "weight_map": weight_map}).encode()


INDEX_DOCS = st.one_of(
    st.builds(
        _index_doc,
        st.dictionaries(st.text(max_size=24), FILE_NAMES | JSON_VALUES, max_size=6) | JSON_VALUES,
        st.dictionaries(st.sampled_from(["metadata", "weight_map_x"]), JSON_VALUES, max_size=2),
    ),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    DEEP_JSON.map(lambda d: ('{"weight_map": ' + d + "}").encode()),
    DEEP_JSON.map(str.encode),
    st.binary(max_size=64),
)


def _fuzz_folder(base: Path) -> Path:
    """A folder with one real shard, a directory, a FIFO, a link to /dev/zero and a loop."""
    folder = base / "hf"
    if not folder.exists():
        folder.mkdir(parents=True)
        formats.safetensors_file(folder / "s.safetensors", {"w": torch.ones(2)})
        (folder / "sub").mkdir()
        os.mkfifo(folder / "fifo.safetensors")
        (folder / "zero.safetensors").symlink_to("/dev/zero")
        (folder / "loop.safetensors").symlink_to(folder / "loop.safetensors")
    return folder


def _read_checked(path: Path, fifo: Path | None) -> None:
    raised = outcome(lambda: sk.read(path), fifo)
    if raised is not None and not isinstance(raised, ALLOWED):
        raise AssertionError(f"{type(raised).__name__}: {raised}") from raised


@FUZZ
@given(doc=INDEX_DOCS)
@example(doc=('{"weight_map": ' + "[" * 100_000 + "}").encode())
@example(doc=b'{"weight_map": {"w": ["s.safetensors"]}}')
@example(doc=b'{"weight_map": {"w": "fifo.safetensors"}}')
def test_fuzzed_index_files(tmp_path_factory: pytest.TempPathFactory, doc: bytes) -> None:
    folder = _fuzz_folder(tmp_path_factory.getbasetemp() / "fuzz-index")
    index = folder / "model.safetensors.index.json"
    index.write_bytes(doc)
    _read_checked(index, folder / "fifo.safetensors")


DTYPES = st.sampled_from(["F32", "I64", "BOOL", "U8", "F16", "BF16", "F8_E4M3", "XX", ""])
DIMS = st.lists(
    st.integers(min_value=-3, max_value=8) | st.integers(min_value=2**40, max_value=2**70)
    | st.booleans() | st.floats(allow_nan=False, max_value=8) | st.none(),
    max_size=6,
)  # fmt: skip
OFFSETS = st.lists(
    st.integers(min_value=-5, max_value=64) | st.integers(min_value=2**62, max_value=2**66),
    max_size=3,
)  # fmt: skip
ENTRIES = st.fixed_dictionaries(
    {"dtype": DTYPES | JSON_VALUES, "shape": DIMS | JSON_VALUES, "data_offsets": OFFSETS}
) | JSON_VALUES  # fmt: skip
ALIASES = st.one_of(
    st.dictionaries(st.text(max_size=8), FILE_NAMES | st.sampled_from(["t0", "t1"]), max_size=3)
    .map(json.dumps),
    JSON_VALUES.map(json.dumps),
    DEEP_JSON,
    st.text(max_size=20),
)  # fmt: skip
METADATA = st.one_of(
    st.dictionaries(st.text(max_size=6), st.text(max_size=8), max_size=2),
    st.builds(lambda a: {"aliases": a}, ALIASES),
    JSON_VALUES,
)


@st.composite
def safetensors_blobs(draw: st.DrawFn) -> bytes:
    header: dict[str, Any] = draw(
        st.dictionaries(st.sampled_from(["t0", "t1", "a" * 300, "é"]), ENTRIES, max_size=3)
    )
    if draw(st.booleans()):
        header["__metadata__"] = draw(METADATA)
    text = draw(
        st.one_of(
            st.just(json.dumps(header).encode()),
            DEEP_JSON.map(str.encode),
            DEEP_JSON.map(lambda d: ('{"t0": ' + d + "}").encode()),
            st.binary(max_size=48),
        )
    )
    length = draw(
        st.just(len(text)) | st.integers(min_value=0, max_value=2**64 - 1)
    )  # fmt: skip
    return struct.pack("<Q", length) + text + draw(st.binary(max_size=64))


def _blob(header: Any, data: bytes = b"") -> bytes:
    text = header.encode() if isinstance(header, str) else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@FUZZ
@given(blob=safetensors_blobs())
@example(blob=_blob('{"t0": ' + "[" * 100_000 + "]" * 100_000 + "}"))
@example(blob=_blob({"t0": {"dtype": "F32", "shape": [0, 10**30], "data_offsets": [0, 0]}}))
@example(blob=_blob({"__metadata__": {"aliases": "[" * 100_000}}))
@example(blob=_blob({"__metadata__": {"aliases": '{"x": ["t0"]}'}}))
@example(blob=_blob({"__metadata__": {"aliases": "5"}}))
def test_fuzzed_safetensors_headers(tmp_path_factory: pytest.TempPathFactory, blob: bytes) -> None:
    folder = tmp_path_factory.getbasetemp() / "fuzz-safetensors"
    folder.mkdir(exist_ok=True)
    path = folder / "f.safetensors"
    path.write_bytes(blob)
    _read_checked(path, None)
