"""One file replaced atomically and durably: the only such write outside a run directory."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

import statekeeper as sk
from statekeeper.storage.local import write_file


def _pieces(*parts: bytes, fail: BaseException | None = None) -> Iterator[bytes | memoryview]:
    for part in parts:
        yield memoryview(part)
    if fail is not None:
        raise fail


def test_writes_the_pieces_in_order_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "new" / "folder" / "w.safetensors"
    assert write_file(target, _pieces(b"abc", b"", b"defg")) == 7
    assert target.read_bytes() == b"abcdefg"
    assert sorted(p.name for p in target.parent.iterdir()) == ["w.safetensors"]
    assert write_file(target, [b"xy"]) == 2  # replaces
    assert target.read_bytes() == b"xy"


@pytest.mark.parametrize(
    ("fail", "raised"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), sk.errors.StorageError),
        (RuntimeError("the source broke"), RuntimeError),
        (KeyboardInterrupt(), KeyboardInterrupt),
    ],
)
def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, fail: BaseException, raised: type[BaseException]
) -> None:
    target = tmp_path / "w.safetensors"
    target.write_bytes(b"old")
    with pytest.raises(raised) as info:
        write_file(target, _pieces(b"new bytes", fail=fail))
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]
    if raised is sk.errors.StorageError:
        assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
        assert str(target) in str(info.value) and "free space" in str(info.value)


def test_a_folder_that_cannot_be_made_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(sk.errors.StorageError, match="temporary file"):
        write_file(tmp_path / "file" / "w.safetensors", [b"x"])
