"""Crafted pickles against the survey + ``pickle.Unpickler`` behind ``restricted_load``.

Each stream is written opcode by opcode, as a hostile ``.metadata`` would be. What is
checked: nothing outside the allowlist is called, no object outside this load is changed, the
unpickler never sees a stream the survey did not read the same way, its memory stays bounded,
and no stand-in class or instance is left anywhere afterwards.
"""

from __future__ import annotations

import ast
import copyreg
import enum
import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.interop import formats

import statekeeper as sk
from statekeeper.format.jsondoc import MAX_DEPTH
from statekeeper.interop.dcp import _allowlist, read_dcp_metadata
from statekeeper.interop.opcodes import (
    DisallowedAttribute,
    DisallowedGlobal,
    restricted_load,
    scan_globals,
    survey_stream,
)

PROTO2 = b"\x80\x02"
SRC = Path(__file__).resolve().parents[2] / "src" / "statekeeper"


glob = formats.pickle_global
text = formats.pickle_text


class Plain:
    pass


class Planter:
    """Its own ``__setstate__`` writes whatever pairs it gets into the instance dict."""

    def __setstate__(self, state: Any) -> None:
        self.__dict__.update(state)


class Color(enum.Enum):
    RED = 1


CALLS: list[Any] = []


def recorder(*args: Any) -> tuple[Any, ...]:
    CALLS.append(args)
    return args


ALLOWED: dict[str, object] = {
    "t.Plain": Plain, "t.Planter": Planter, "t.Color": Color, "t.rec": recorder,
    "torch.Size": torch.Size,
}  # fmt: skip


def new(name: bytes) -> bytes:
    return glob(b"t", name) + b")\x81"


@pytest.fixture(autouse=True)
def _no_calls() -> None:
    CALLS.clear()


def test_results_hold_the_real_classes_never_a_stand_in() -> None:
    # a rebuilt object, one from the same global never built, and the class as a value
    data = PROTO2 + glob(b"t", b"Plain") + b"q\x00)\x81}" + text("x") + b"K\x05sbh\x00)\x81"
    data += glob(b"t", b"Plain") + b"\x87."
    first, second, cls = restricted_load(data, ALLOWED)
    assert type(first) is Plain and type(second) is Plain and cls is Plain
    assert vars(first) == {"x": 5} and vars(second) == {}


def test_no_stand_in_survives_a_load_that_fails() -> None:
    # the recorder keeps the first object; the second BUILD is refused afterwards
    data = PROTO2 + glob(b"t", b"rec") + new(b"Plain") + b"}" + text("x") + b"K\x01sb\x85R0"
    data += new(b"Plain") + b"}" + text("__class__") + b"K\x01sb."
    with pytest.raises(DisallowedAttribute):
        restricted_load(data, ALLOWED)
    ((kept,),) = CALLS
    assert type(kept) is Plain and vars(kept) == {"x": 1}


def test_a_setstate_planted_on_the_instance_is_never_called() -> None:
    """``Planter``'s own ``__setstate__`` stores a ``__setstate__`` on the instance (the
    survey cannot see into a list of pairs); the next ``BUILD`` still calls the class's."""
    planted = b"]" + text("__setstate__") + glob(b"t", b"rec") + b"\x86ab"
    data = PROTO2 + new(b"Planter") + planted + b"]" + text("y") + b"K\x01\x86ab."
    obj = restricted_load(data, ALLOWED)
    assert CALLS == []
    # (typing) an attribute the object gets from its unpickled state
    assert type(obj) is Planter and obj.y == 1  # type: ignore[attr-defined]
    assert vars(obj)["__setstate__"] is recorder  # planted, yet never called


@pytest.mark.parametrize(
    ("target", "what"),
    [
        (glob(b"t", b"Color") + b"K\x01\x85R", "t.Color"),  # the enum's member: a singleton
        (glob(b"t", b"rec"), "global t.rec"),  # a function of this process
        (b"]", "list"),
        (glob(b"torch", b"Size") + b")R", "torch.Size"),
        (glob(b"t", b"rec") + b")R", "t.rec"),  # what a call returned
    ],
    ids=["enum-member", "function", "list", "builtin-type", "call-result"],
)
def test_build_only_reaches_new_objects_of_plain_classes(target: bytes, what: str) -> None:
    data = PROTO2 + target + b"}" + text("x") + b"K\x01sb."
    with pytest.raises(ValueError, match="BUILD on") as info:
        restricted_load(data, ALLOWED)
    assert what in str(info.value)
    assert not isinstance(info.value, DisallowedGlobal)
    assert vars(Color.RED).get("x") is None and not hasattr(recorder, "x")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (glob(b"t", b"rec") + b")R)R", "not a global"),  # calling what a call returned
        (glob(b"t", b"rec") + b"]R", "not a tuple"),
        (glob(b"t", b"Plain") + b"K\x01\x81", "not a tuple"),
        (glob(b"t", b"rec") + b")\x81", r"NEWOBJ of t\.rec"),
        (new(b"Plain") + b"K\x01a", "not a list"),
        (new(b"Plain") + b"K\x01K\x02s", "not a dict"),
        (b"](K\x01\x90", "not a set"),
        (b"}(K\x01d", "odd number"),
    ],
    ids=["call-of-result", "reduce-list-args", "newobj-no-args", "newobj-function",
         "append-to-object", "setitem-on-object", "additems-to-list", "dict-odd"],
)  # fmt: skip
def test_calls_and_container_ops_are_checked_before_anything_runs(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        restricted_load(PROTO2 + data + b".", ALLOWED)
    assert CALLS == []


@pytest.mark.parametrize(
    "op",
    [b"\x82\x01", b"\x83\x01\x00", b"\x84\x01\x00\x00\x00", b"Pid\n", b"K\x01Q",
     b"(it\nrec\n", b"(" + glob(b"t", b"rec") + b"o", glob(b"t", b"rec") + b")}\x92",
     b"\x97", b"K\x01\x98"],
    ids=["EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "INST", "OBJ", "NEWOBJ_EX",
         "NEXT_BUFFER", "READONLY_BUFFER"],
)  # fmt: skip
def test_opcodes_outside_plain_data_are_refused(op: bytes) -> None:
    copyreg.add_extension("t", "rec", 1)  # even a code registered to an allowed global
    try:
        with pytest.raises(ValueError, match="is not supported"):
            restricted_load(PROTO2 + op + b".", ALLOWED)
    finally:
        copyreg.remove_extension("t", "rec", 1)
    assert CALLS == []


def test_inst_names_its_global_in_the_scan() -> None:
    assert scan_globals(b"(it\nPlain\n.") == ["t.Plain"]
    with pytest.raises(DisallowedGlobal, match=r"os\.system"):
        restricted_load(b"(ios\nsystem\n.", ALLOWED)


def test_a_huge_memo_index_is_refused_before_the_unpickler_sizes_its_memo() -> None:
    """The C unpickler grows its memo array to twice the highest PUT index (34 GB here)."""
    data = PROTO2 + b"K\x01r\xff\xff\xff\xff."
    with pytest.raises(ValueError, match="memo index 4294967295"):
        restricted_load(data, ALLOWED)
    data = PROTO2 + b"K\x01j\xff\xff\xff\xff."
    with pytest.raises(ValueError, match="never stored"):
        restricted_load(data, ALLOWED)


def test_deeply_nested_tuples_are_refused_before_anything_hashes_them() -> None:
    def nest(n: int) -> bytes:
        return PROTO2 + b")" + b"\x85" * n + b"."

    assert restricted_load(nest(MAX_DEPTH - 1), {}) is not None
    with pytest.raises(ValueError, match=f"more than the {MAX_DEPTH} allowed"):
        restricted_load(nest(MAX_DEPTH), {})
    key = b"}" + b")" + b"\x85" * 1000 + b"K\x01s."  # a dict key: hashing it would recurse in C
    with pytest.raises(ValueError, match="tuples nest"):
        restricted_load(PROTO2 + key, {})


def test_an_opcode_running_past_its_frame_is_refused() -> None:
    """The C unpickler reads such an opcode from other bytes than pickletools does (it drops
    the rest of the frame): the survey would not describe what runs."""
    data = b"\x80\x04\x95\x0c\x00\x00\x00\x00\x00\x00\x00(\x8c\x01x\x94X\t\x00\x00\x00"
    data += b"__class__K\x01K\x02\x91\x94."
    with pytest.raises(ValueError, match="past the end of its FRAME"):
        restricted_load(data, ALLOWED)


def test_a_class_that_is_built_cannot_also_be_a_value() -> None:
    data = PROTO2 + glob(b"t", b"Plain") + b"q\x00)\x81}" + text("x") + b"K\x01sbh\x00\x86."
    with pytest.raises(ValueError, match=r"t\.Plain both makes objects"):
        restricted_load(data, ALLOWED)


def test_globals_are_refused_wherever_they_are_in_a_damaged_stream() -> None:
    data = PROTO2 + b"K\x01\x86" + glob(b"os", b"system") + b"."  # underflow first
    with pytest.raises(DisallowedGlobal, match=r"os\.system"):
        restricted_load(data, ALLOWED)


def test_the_survey_of_real_metadata(tmp_path: Path) -> None:
    folder = formats.dcp_folder(tmp_path / "dcp", {"w": torch.ones(2), "extra": {"n": 7}})
    data = (folder / ".metadata").read_bytes()
    found = survey_stream(io.BytesIO(data), _allowlist())
    assert found.problem is None
    assert "torch.distributed.checkpoint.metadata.Metadata" in found.globals
    built = {found.names[i].rsplit(".", 1)[1] for i in found.stand_ins}
    assert "Metadata" in built and "BytesStorageMetadata" not in built  # never BUILT
    md = read_dcp_metadata(folder)
    assert type(md).__name__ == "Metadata" and type(md) is type(pickle.loads(data))


def test_hostile_metadata_is_corrupt_or_unsafe(tmp_path: Path) -> None:
    folder = tmp_path / "dcp"
    folder.mkdir()
    cases = {
        PROTO2 + b"K\x01r\xff\xff\xff\xff.": (sk.CorruptCheckpointError, "memo index"),
        PROTO2 + b")" + b"\x85" * 200_000 + b".": (sk.CorruptCheckpointError, "tuples nest"),
        PROTO2 + b"K\x01Q.": (sk.CorruptCheckpointError, "BINPERSID is not supported"),
        PROTO2 + b"\x82\x01.": (sk.CorruptCheckpointError, "EXT1 is not supported"),
        PROTO2 + glob(b"torch", b"float32") + b"}" + text("x") + b"K\x01sb.": (
            sk.CorruptCheckpointError, "BUILD on the global torch.float32"),
    }  # fmt: skip
    for data, (error, words) in cases.items():
        (folder / ".metadata").write_bytes(data)
        with pytest.raises(error, match=words):
            read_dcp_metadata(folder)


def test_only_the_restricted_unpickler_imports_pickle_and_it_never_loads_freely() -> None:
    """The one ``pickle.Unpickler`` of the library lives in ``interop/unpickler.py``; it
    subclasses the unpickler and loads nothing else (no ``pickle.load``/``loads``)."""
    importers = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] in {"pickle", "_pickle", "dill", "cloudpickle"} for n in names):
                importers.append(path.relative_to(SRC).as_posix())
    assert importers == ["interop/unpickler.py"]
    tree = ast.parse((SRC / "interop" / "unpickler.py").read_text())
    used = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "pickle"
    }
    assert used == {"Unpickler", "UnpicklingError"}
    assert not any(isinstance(n, ast.ImportFrom) and n.module == "pickle" for n in ast.walk(tree))


def test_every_protocol_loads() -> None:
    value = {"t": (1, 2.5, "x", None, True, 2**70), "l": [1, [2]], "s": {3}, "f": frozenset({4})}
    allowed = {"builtins.set": set, "builtins.frozenset": frozenset}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert restricted_load(pickle.dumps(value, protocol=protocol), allowed) == value


def test_the_unpickler_stops_at_a_global_the_survey_did_not_read() -> None:
    """Defence in depth: were the survey and the C unpickler ever to read a stream apart,
    the first global they disagree on stops the load."""
    from statekeeper.interop.unpickler import AllowlistUnpickler

    data = PROTO2 + glob(b"t", b"rec") + b")R."
    with pytest.raises(ValueError, match=r"global t\.rec was not found by the survey"):
        AllowlistUnpickler(data, ALLOWED, ["t.Plain"], frozenset()).load_restored()
    with pytest.raises(ValueError, match="not found by the survey"):
        AllowlistUnpickler(data, ALLOWED, [], frozenset()).load_restored()
    assert CALLS == []
