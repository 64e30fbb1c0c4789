"""A structure-aware fuzzer over statekeeper's own parsers and its step reader.

The strategies build what random bytes rarely reach: deep nesting, huge and negative numbers,
long names, wrong types, path tricks. Every input either parses or raises the documented
error (``CorruptCheckpointError`` / ``UnsupportedFormatError``; ``ValueError`` from the
low-level safetensors parser), never anything else, never a crash, never a hang.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers.hostile import ENTRY, MANIFEST, SHARD, reseal, saved_run

import statekeeper as sk
from statekeeper.catalog.location import locate
from statekeeper.catalog.naming import parse_entry
from statekeeper.catalog.verify_step import verify_step
from statekeeper.format.manifest import Manifest
from statekeeper.format.safetensors_io import parse
from statekeeper.storage.files import name_problem

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
ALLOWED = (sk.CorruptCheckpointError, sk.errors.UnsupportedFormatError)

TRICKY_TEXT = st.sampled_from(
    ["", ".", "..", "../x", "/etc/passwd", "a/b", "a\x00b", "\\x", "~", "$tensor", "$dict",
     "tensors-00000.safetensors", "manifest.json", "x" * 300, "é", "\ud7ff", "step_1"]
)  # fmt: skip
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**62, 2**63, 2**64, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TRICKY_TEXT, st.text(max_size=20))


def _json(max_leaves: int = 20) -> st.SearchStrategy[Any]:
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.one_of(TRICKY_TEXT, st.text(max_size=8)), inner, max_size=4),
        ),
        max_leaves=max_leaves,
    )


@st.composite
def _json_text(draw: st.DrawFn) -> str:
    """JSON text, sometimes wrapped in nesting far deeper than any parser recursion limit."""
    body = json.dumps(draw(_json()))
    depth = draw(st.sampled_from([0, 0, 0, 50, 150, 5_000, 200_000]))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    return opener * depth + body + closer * depth


def _succeeds(call: Any) -> bool:
    """Whether ``call`` returned; it may only raise the documented errors."""
    try:
        call()
    except (*ALLOWED, sk.StepNotFoundError):
        return False
    return True


MEMBERS = ["step", "created", "library", "metrics", "files", "tensors", "aliases", "state"]


@given(member=st.sampled_from(MEMBERS), value=_json_text())
@SETTINGS
def test_resealed_manifests_parse_or_fail_cleanly_and_the_step_reads_or_fails_cleanly(
    member: str, value: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = saved_run(Path(tmp))
        path = run / ENTRY / MANIFEST
        text = path.read_text()
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if line.startswith(f'"{member}":'):
                end = i
                while not (lines[end].endswith(",") and lines[end + 1].startswith('"')):
                    end += 1
                lines[i : end + 1] = [f'"{member}":{value},']
                break
        data = reseal("\n".join(lines))
        with contextlib.suppress(ALLOWED):
            Manifest.from_bytes(str(path), data)
        path.write_bytes(data)
        read_ok = _succeeds(lambda: sk.read(run))
        location = locate(run, None)
        assert _succeeds(lambda: verify_step(location)) == read_ok  # verify agrees with read


@st.composite
def _entry(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return draw(_json(6))
    return {
        "dtype": draw(st.one_of(st.sampled_from(["F32", "I64", "BOOL", "F8_E4M3", "X"]), SCALARS)),
        "shape": draw(st.one_of(st.lists(NUMBERS, max_size=4), SCALARS)),
        "data_offsets": draw(st.one_of(st.lists(NUMBERS, min_size=2, max_size=2), SCALARS)),
    }


@given(
    entries=st.dictionaries(st.one_of(TRICKY_TEXT, st.text(max_size=8)), _entry(), max_size=4),
    data=st.binary(max_size=64),
    claimed=st.one_of(st.none(), st.sampled_from([0, 7, 2**40, 2**63, 2**64 - 1])),
    depth=st.sampled_from([0, 0, 200_000]),
)
@SETTINGS
def test_safetensors_headers_parse_or_raise_value_error(
    entries: dict[str, Any], data: bytes, claimed: int | None, depth: int
) -> None:
    header = ("[" * depth + json.dumps(entries) + "]" * depth).encode()
    size = len(header) if claimed is None else claimed
    blob = struct.pack("<Q", size) + header + data
    for buffer in (blob, bytearray(blob)):
        try:
            tensors = parse(buffer)
        except ValueError:
            continue
        for t in tensors.values():  # whatever parsed is backed by the bytes present
            assert t.numel() * t.element_size() <= len(blob)


@given(step_file=st.binary(max_size=200), manifest=st.binary(max_size=200))
@SETTINGS
def test_random_bytes_in_place_of_a_step_s_files_are_damage(
    step_file: bytes, manifest: bytes
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = saved_run(Path(tmp))
        (run / ENTRY / SHARD).write_bytes(step_file)
        with contextlib.suppress(ALLOWED):
            sk.read(run)
        (run / ENTRY / MANIFEST).write_bytes(manifest)
        with contextlib.suppress(ALLOWED):
            sk.read(run)
        assert [i.step for i in sk.list_checkpoints(run)] == [1]
        shutil.rmtree(run)


@given(name=st.one_of(TRICKY_TEXT, st.text(max_size=40), SCALARS))
@SETTINGS
def test_file_names_are_plain_components_or_refused(name: Any) -> None:
    problem = name_problem(name)
    if problem is None:
        assert isinstance(name, str) and name not in (".", "..")
        assert "/" not in name and "\\" not in name and "\x00" not in name
        assert 0 < len(name) <= 255


@given(name=st.one_of(TRICKY_TEXT, st.text(max_size=40), st.from_regex(r"step_\d+(\.\w+-\w+)?")))
@SETTINGS
def test_entry_names_parse_or_are_ignored(name: str) -> None:
    parsed = parse_entry(name)
    assert parsed is None or (parsed.name == name and parsed.step >= 0)
