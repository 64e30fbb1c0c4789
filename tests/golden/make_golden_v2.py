"""Generate the format-version-2 golden checkpoint: ``python tests/golden/make_golden_v2.py``.

Version 2 is what a multi-process save writes: global tensors stored as chunks (one file per
rank), per-rank state, and the ``sharded`` and ``ranks`` manifest members. This builds one
by the documented construction (docs/format.md, "Version 2"), as two ranks would write it:
``model/w`` (4x3) split by rows, ``model/b`` (a replicated tensor stored once, by rank 1),
and one per-rank tensor and value each. Exact constants and pinned provenance make the same
bytes on every machine; ``tests/format/test_golden_v2.py`` compares them with the committed
files, which pin version 2 forever: never regenerate them to make a test pass.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from statekeeper.catalog.naming import step_entry
from statekeeper.checkpoint.writer import write_shard
from statekeeper.format.manifest import MANIFEST, FileRecord, Manifest, TensorRecord
from statekeeper.format.sharding import Chunk, ShardedRecord, Sharding
from statekeeper.state.tree import flatten
from statekeeper.storage.local import LocalStorage

GOLDEN_ROOT = Path(__file__).resolve().parent / "v2"
STEP = 11
CREATED = "2026-01-01T00:00:00.000000Z"
LIBRARY = {"statekeeper": "golden", "torch": "golden"}

W = torch.arange(12, dtype=torch.float32).reshape(4, 3) * 0.5
B = torch.tensor([1.0, -2.0, 3.0, -4.0], dtype=torch.bfloat16)


def expected_state(rank: int = 0) -> dict[str, Any]:
    """What reading the step gives (with ``rank``'s per-rank entries)."""
    return {
        "model": {"w": W, "b": B},
        "progress": {"epoch": 2, "seen": (5, 6)},
        "sampler": {"offset": torch.tensor([10 + rank], dtype=torch.int64), "rank": rank},
    }


def write_golden(root: Path) -> Path:
    storage = LocalStorage(root)
    main = flatten({k: v for k, v in expected_state().items() if k != "sampler"})
    chunk_files = {
        "chunks-00000.safetensors": {"$chunk/model/w@0,0": W[:2].clone()},
        "chunks-00001.safetensors": {
            "$chunk/model/w@2,0": W[2:].clone(),
            "$chunk/model/b@0": B.clone(),
        },
    }
    rows = (Chunk("$chunk/model/w@0,0", (0, 0)), Chunk("$chunk/model/w@2,0", (2, 0)))
    sharded = {
        "model/w": ShardedRecord("float32", (4, 3), rows),
        "model/b": ShardedRecord("bfloat16", (4,), (Chunk("$chunk/model/b@0", (0,)),)),
    }
    txn = storage.begin(step_entry(STEP))
    files: dict[str, FileRecord] = {}
    tensors: dict[str, TensorRecord] = {}
    skeletons = []
    for file, members in chunk_files.items():
        files[file] = write_shard(txn, file, members)
        for name, t in members.items():
            tensors[name] = TensorRecord(file, str(t.dtype).removeprefix("torch."), tuple(t.shape))
    for rank in (0, 1):
        flat = flatten({"sampler": expected_state(rank)["sampler"]}, root=f"$rank/{rank}")
        file = f"rank-{rank:05d}.safetensors"
        files[file] = write_shard(txn, file, flat.tensors)
        for name, t in flat.tensors.items():
            tensors[name] = TensorRecord(file, "int64", tuple(t.shape))
        skeletons.append(flat.skeleton)
    manifest = Manifest(
        step=STEP,
        created=CREATED,
        library=LIBRARY,
        metrics={},
        files=files,
        tensors=tensors,
        aliases={},
        state=main.skeleton,
        sharding=Sharding(sharded, skeletons),
    )
    txn.write(MANIFEST, manifest.to_bytes())
    txn.commit()
    (root / ".statekeeper.lock").unlink(missing_ok=True)
    return root / step_entry(STEP)


def main() -> int:
    if GOLDEN_ROOT.exists():
        shutil.rmtree(GOLDEN_ROOT)
    print(write_golden(GOLDEN_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
