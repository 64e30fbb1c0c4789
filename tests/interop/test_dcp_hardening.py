"""DCP ``.metadata`` and data files that try to escape the allowlist, the folder or the tensor.

Each test crafts the bytes or the metadata a hostile or damaged checkpoint would hold.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.interop import formats
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

import statekeeper as sk
from statekeeper.interop.dcp import _allowlist, read_dcp, read_dcp_metadata
from statekeeper.interop.opcodes import DisallowedAttribute, DisallowedGlobal, restricted_load

PROTO2 = b"\x80\x02"
MD = b"torch.distributed.checkpoint.metadata"


glob = formats.pickle_global
text = formats.pickle_text


class Plain:
    """An allowlisted class without ``__setstate__``."""


class Other:
    pass


class WithSetstate:
    def __setstate__(self, state: Any) -> None:
        self.got = ("class", state)


CALLS: list[Any] = []


def recorder(*args: Any) -> None:
    CALLS.append(args)


ALLOWED = {"t.Plain": Plain, "t.Other": Other, "t.WithSetstate": WithSetstate, "t.rec": recorder}


def new(name: bytes) -> bytes:
    """``NEWOBJ`` of the allowlisted class ``t.<name>`` with no arguments."""
    return glob(b"t", name) + b")\x81"


def test_build_cannot_plant_setstate_on_the_instance() -> None:
    CALLS.clear()
    # BUILD 1 stores {"__setstate__": recorder}; BUILD 2 would then call it with any state
    data = PROTO2 + new(b"Plain") + b"}" + text("__setstate__") + glob(b"t", b"rec") + b"sb"
    data += text("PROOF-CALLED") + b"b."
    with pytest.raises(DisallowedGlobal, match="__setstate__") as info:
        restricted_load(data, ALLOWED)
    assert isinstance(info.value, DisallowedAttribute)
    assert CALLS == []


def test_build_cannot_swap_the_class() -> None:
    data = PROTO2 + new(b"Plain") + b"}" + text("__class__") + glob(b"t", b"Other") + b"sb."
    with pytest.raises(DisallowedGlobal, match="__class__"):
        restricted_load(data, ALLOWED)


@pytest.mark.parametrize("key", ["__dict__", "__init__", "__reduce__"])
def test_build_refuses_dunder_keys_in_state_and_slotstate(key: str) -> None:
    state = b"}" + text(key) + b"K\x01s"
    as_dict = PROTO2 + new(b"Plain") + state + b"b."
    as_slots = PROTO2 + new(b"Plain") + b"N" + state + b"\x86b."
    for data in (as_dict, as_slots):
        with pytest.raises(DisallowedAttribute):
            restricted_load(data, ALLOWED)
    with pytest.raises(DisallowedAttribute):  # also with the class's own __setstate__
        restricted_load(PROTO2 + new(b"WithSetstate") + state + b"b.", ALLOWED)


def test_build_uses_the_class_setstate_and_plain_attributes() -> None:
    data = PROTO2 + new(b"Plain") + b"}" + text("x") + b"K\x05sb."
    assert vars(restricted_load(data, ALLOWED)) == {"x": 5}
    slots = PROTO2 + new(b"Plain") + b"N}" + text("y") + b"K\x06s\x86b."
    assert vars(restricted_load(slots, ALLOWED)) == {"y": 6}
    data = PROTO2 + new(b"WithSetstate") + text("s") + b"b."
    assert restricted_load(data, ALLOWED).got == ("class", "s")


@pytest.mark.parametrize(
    "data",
    [
        PROTO2 + b"K\x01\x86.",  # TUPLE2 with one item
        PROTO2 + b"\x85.",  # TUPLE1 on an empty stack
        PROTO2 + b"K\x01K\x02\x87.",  # TUPLE3 with two items
        PROTO2 + b"K\x01(K\x02\x86.",  # TUPLE2 reaching across a MARK
        PROTO2 + b"(.",  # a MARK as the result
        PROTO2 + b"K\x01(0K\x02\x86(t.",  # MARK left under the result
        PROTO2 + b"0.",  # POP on an empty stack
        PROTO2 + b"(q\x00.",  # PUT of a MARK
        PROTO2 + b"h\x05.",  # GET of a memo entry never stored
        PROTO2 + b"(2.",  # DUP of a MARK
        PROTO2 + glob(b"t", b"rec") + b"(R.",  # REDUCE with a MARK as its arguments
    ],
    ids=["tuple2-short", "tuple1-empty", "tuple3-short", "tuple2-across-mark", "mark-result",
         "mark-under-result", "pop-empty", "put-mark", "get-missing", "dup-mark", "reduce-mark"],
)  # fmt: skip
def test_stack_underflow_and_stray_marks_are_malformed(data: bytes) -> None:
    with pytest.raises(ValueError, match="malformed pickle") as info:
        restricted_load(data, ALLOWED)
    assert not isinstance(info.value, DisallowedGlobal)


def metadata_folder(tmp_path: Path, data: bytes) -> Path:
    folder = tmp_path / "dcp"
    folder.mkdir()
    (folder / ".metadata").write_bytes(data)
    return folder


def test_dunder_build_in_metadata_is_an_unsafe_pickle(tmp_path: Path) -> None:
    data = PROTO2 + glob(MD, b"ChunkStorageMetadata") + b")\x81}" + text("__setstate__")
    data += glob(b"torch.serialization", b"_get_layout") + b"sb" + text("PROOF-CALLED") + b"b."
    folder = metadata_folder(tmp_path, data)
    with pytest.raises(sk.errors.UnsafePickleError, match=r"__setstate__") as info:
        read_dcp_metadata(folder)
    assert info.value.path == str(folder / ".metadata")


@pytest.mark.parametrize(
    ("data", "raised"),
    [
        # TensorProperties.__setstate__ raises RuntimeError for a bad memory format
        (
            PROTO2 + glob(MD, b"TensorProperties") + b")\x81(" + glob(b"torch", b"float32")
            + glob(b"torch", b"strided") + b"\x89K\x07\x89tb.",
            "RuntimeError",
        ),
        # WindowsPath raises NotImplementedError on this system
        (PROTO2 + glob(b"pathlib", b"WindowsPath") + text("x") + b"\x85R.", "NotImplementedError"),
        (PROTO2 + b"K\x01\x86.", "ValueError"),
    ],
    ids=["tensorproperties-setstate", "windowspath", "tuple2-short"],
)  # fmt: skip
def test_errors_of_allowlisted_constructors_are_corruption(
    tmp_path: Path, data: bytes, raised: str
) -> None:
    folder = metadata_folder(tmp_path, data)
    with pytest.raises(sk.CorruptCheckpointError, match=raised) as info:
        read_dcp_metadata(folder)
    assert info.value.path == str(folder / ".metadata")


def test_allowlist_still_reads_real_metadata(tmp_path: Path) -> None:
    folder = formats.dcp_folder(tmp_path / "dcp", {"w": torch.ones(2, 3)})
    md = read_dcp_metadata(folder)
    assert md.state_dict_metadata["w"].properties.dtype == torch.float32
    assert restricted_load((folder / ".metadata").read_bytes(), _allowlist()) is not None


def saved(tmp_path: Path) -> tuple[Path, Any]:
    folder = formats.dcp_folder(tmp_path / "dcp", {"w": torch.arange(6.0).reshape(2, 3)})
    return folder, pickle.loads((folder / ".metadata").read_bytes())


def rewrite(folder: Path, md: Any) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(md, protocol=4))


def test_missing_chunks_are_corruption_not_garbage(tmp_path: Path) -> None:
    folder, md = saved(tmp_path)
    assert torch.equal(read_dcp(folder)["w"], torch.arange(6.0).reshape(2, 3))
    md.state_dict_metadata["w"].size = torch.Size([4, 3])  # rows 2-3 never written
    rewrite(folder, md)
    with pytest.raises(sk.CorruptCheckpointError, match=r"cover 6 of its 12 elements") as info:
        read_dcp(folder)
    assert info.value.path == str(folder / ".metadata")
    md.state_dict_metadata["w"].chunks.clear()
    rewrite(folder, md)
    with pytest.raises(sk.CorruptCheckpointError, match=r"cover 0 of"):
        read_dcp(folder)


def add_chunk(md: Any, offsets: list[int], sizes: list[int]) -> None:
    """A second chunk of ``w`` at ``offsets``, backed by the same stored item."""
    md.state_dict_metadata["w"].chunks.append(
        ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
    )
    info = md.storage_data[MetadataIndex("w", torch.Size([0, 0]))]
    md.storage_data[MetadataIndex("w", torch.Size(offsets))] = info


def test_overlapping_chunks_are_corruption(tmp_path: Path) -> None:
    folder, md = saved(tmp_path)
    md.state_dict_metadata["w"].size = torch.Size([3, 3])
    add_chunk(md, [1, 0], [2, 3])
    rewrite(folder, md)
    with pytest.raises(sk.CorruptCheckpointError, match="overlap"):
        read_dcp(folder)


def test_chunks_outside_the_tensor_are_corruption(tmp_path: Path) -> None:
    folder, md = saved(tmp_path)
    add_chunk(md, [2, 0], [2, 3])
    rewrite(folder, md)
    with pytest.raises(sk.CorruptCheckpointError, match="do not lie inside"):
        read_dcp(folder)


def point_items_to(folder: Path, md: Any, relative: str) -> None:
    for info in md.storage_data.values():
        info.relative_path = relative
    rewrite(folder, md)


def test_data_files_outside_the_folder_are_refused(tmp_path: Path) -> None:
    folder, md = saved(tmp_path)
    (data,) = folder.glob("*.distcp")
    outside = tmp_path / "outside.distcp"
    shutil.copyfile(data, outside)  # a file that would read back fine
    link = folder / "link.distcp"
    link.symlink_to(outside)
    for relative in ("../outside.distcp", str(outside), "/etc/hostname", f"sub/../{data.name}"):
        point_items_to(folder, md, relative)  # a name must be one plain path component
        with pytest.raises(sk.CorruptCheckpointError, match="is not one path component"):
            read_dcp(folder)
    point_items_to(folder, md, "link.distcp")
    with pytest.raises(sk.CorruptCheckpointError, match="outside the checkpoint folder"):
        read_dcp(folder)


def test_negative_item_offset_is_corruption(tmp_path: Path) -> None:
    folder, md = saved(tmp_path)
    for info in md.storage_data.values():
        info.offset = -5
    rewrite(folder, md)
    with pytest.raises(sk.CorruptCheckpointError, match="negative offset"):
        read_dcp(folder)
