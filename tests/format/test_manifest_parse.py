"""The manifest parser that reads ``tensors`` entry by entry gives what ``json.loads`` gives,
for well-formed and malformed documents alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from statekeeper.format.manifest_parse import TensorRecord, TensorRecords, parse_manifest_json

_RECORD = '{"file":"f","dtype":"float32","shape":[1,2]}'
DOCUMENTS = [
    "{}",
    " { } \n",
    '{"a":1}',
    '{"tensors":{}}',
    '{"tensors":{"x":' + _RECORD + '}, "b":[1,{"c":null}]}',
    '{\n "tensors" : { "x" : {"file":"f","dtype":"d","shape":[]} ,\t"y":{"shape":[true]} }\n}\n',
    '{"tensors":{"x":{"file":"f","dtype":"d","shape":[1]},"x":' + _RECORD + "}}",
    '{"tensors":[1]}',
    '{"a":1,"a":2}',
    '{"n":' + "9" * 5000 + "}",
    "[1,2]",
    '"s"',
    '{"a":1,}',
    '{"a":1 "b":2}',
    '{"a"}',
    "{a:1}",
    '{"a":1}x',
    "",
    '{"tensors":{"x":1,}}',
    '{"tensors":{"x":' + _RECORD,
    '{"tensors":{"x":' + _RECORD + "}",
    '{"s":"\\ud800"}',
    '{"deep":' + "[" * 5000 + "]" * 5000 + "}",
]


def _plain(value: Any) -> Any:
    if isinstance(value, TensorRecords):
        return {
            k: {"file": v.file, "dtype": v.dtype, "shape": list(v.shape)}
            if isinstance(v, TensorRecord)
            else v
            for k, v in value.items()
        }
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _json_loads(text: str) -> Any:
    from statekeeper.format.jsondoc import parse_json

    return parse_json(text)


@pytest.mark.parametrize("text", DOCUMENTS)
def test_same_result_as_json_loads(text: str) -> None:
    try:
        expected: Any = ("ok", _json_loads(text))
    except ValueError:
        expected = ("error",)
    try:
        got: Any = ("ok", _plain(parse_manifest_json(text)))
    except ValueError:
        got = ("error",)
    assert got == expected


def test_entries_become_shared_records_and_bad_ones_are_flagged() -> None:
    body = parse_manifest_json(
        '{"tensors":{"a":' + _RECORD + ',"b":' + _RECORD + ',"c":{"file":"f"}}}'
    )
    tensors = body["tensors"]
    assert isinstance(tensors, TensorRecords) and tensors.malformed == ["c"]
    a, b = tensors["a"], tensors["b"]
    assert a == TensorRecord("f", "float32", (1, 2))
    assert a.file is b.file and a.shape is b.shape  # one object each, not one per tensor
    assert json.loads('{"c":{"file":"f"}}')["c"] == tensors["c"]
