"""A rank's read plan, in one process: the chunks that overlap its part, and refusal of
chunks that do not tile a tensor exactly (a read would leave elements as they were)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import statekeeper as sk
from statekeeper.catalog.location import locate
from statekeeper.catalog.manifests import read_manifest
from statekeeper.distributed.files import VerifiedFiles
from statekeeper.format.sharding import Chunk, ShardedRecord


@pytest.fixture
def files(tmp_path: Path) -> VerifiedFiles:
    sk.save(tmp_path, {"m": {"a": torch.arange(12.0).reshape(3, 4), "b": torch.ones(2, 4)}}, step=1)
    location = locate(tmp_path, None)
    return VerifiedFiles(location, read_manifest(location))


def test_parts_are_read_from_the_chunks_that_overlap_them(files: VerifiedFiles) -> None:
    # one 5x4 tensor stored as two chunks: rows 0-2 ("m/a") and rows 3-4 ("m/b")
    record = ShardedRecord("float32", (5, 4), (Chunk("m/a", (0, 0)), Chunk("m/b", (3, 0))))
    files.check_tiling({"t": record})
    whole = torch.cat([torch.arange(12.0).reshape(3, 4), torch.ones(2, 4)])
    assert torch.equal(files.read_part(record, ((0, 0), (5, 4))), whole)
    assert torch.equal(files.read_part(record, ((2, 1), (2, 2))), whole[2:4, 1:3])
    inside = files.read_part(record, ((0, 0), (3, 4)))  # one chunk holds it all: a view
    assert torch.equal(inside, whole[:3])
    out = torch.full((2, 4), -1.0)
    files.read_part(record, ((3, 0), (2, 4)), out)
    assert torch.equal(out, torch.ones(2, 4))


@pytest.mark.parametrize(
    ("shape", "chunks", "dtype"),
    [
        ((6, 4), ((0, 0), (3, 0)), "float32"),  # row 5 is in no chunk
        ((5, 4), ((0, 0), (2, 0)), "float32"),  # rows 2-3 twice
        ((5, 4), ((0, 0), (3, 0)), "float16"),  # another dtype than the chunks'
    ],
)
def test_chunks_that_do_not_tile_are_a_corrupt_checkpoint(
    files: VerifiedFiles, shape: tuple[int, ...], chunks: tuple[tuple[int, ...], ...], dtype: str
) -> None:
    record = ShardedRecord(dtype, shape, (Chunk("m/a", chunks[0]), Chunk("m/b", chunks[1])))
    with pytest.raises(sk.CorruptCheckpointError, match="sharded tensor 't'"):
        files.check_tiling({"t": record})
