"""The I/O fast paths: threaded hashing on save and load, early write-back, staged copies.

Small test states stay below the sizes where these paths switch on, so each test lowers the
threshold to make every file and chunk take the fast path, and checks the result against
what the plain path gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import statekeeper as sk
import statekeeper.catalog.verifier as verifier
import statekeeper.checkpoint.writer as writer
import statekeeper.storage.durable as durable
from statekeeper.format.manifest import TensorRecord, _compact, _tensor_lines
from statekeeper.format.safetensors_io import layout, parse, stream

SHARD_BYTES = 4096  # several shard files per step


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {f"t{i}": torch.randn(300 + i, generator=gen) for i in range(12)}


@pytest.fixture
def fast_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "HASH_IN_THREAD_FROM", 0)
    monkeypatch.setattr(verifier, "THREAD_FROM", 0)
    monkeypatch.setattr(durable, "WRITEBACK_EVERY", 1)


def _save(path: Path, step: int = 1) -> None:
    sk.save(path, {"w": _state()}, step=step, shard_bytes=SHARD_BYTES)


def test_fast_paths_write_the_same_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _save(tmp_path / "plain")
    monkeypatch.setattr(writer, "HASH_IN_THREAD_FROM", 0)
    monkeypatch.setattr(durable, "WRITEBACK_EVERY", 1)
    _save(tmp_path / "fast")
    plain, fast = tmp_path / "plain" / "step_000000001", tmp_path / "fast" / "step_000000001"
    shards = sorted(p.name for p in plain.glob("*.safetensors"))
    assert len(shards) > 2 and shards == sorted(p.name for p in fast.glob("*.safetensors"))
    for name in shards:
        assert (plain / name).read_bytes() == (fast / name).read_bytes()
    manifest = sk.read(tmp_path / "fast")
    for name, t in _state().items():
        assert torch.equal(manifest["w"][name], t)


def test_threaded_verification_reports_the_first_bad_file(tmp_path: Path, fast_paths: None) -> None:
    _save(tmp_path)
    step = tmp_path / "step_000000001"
    shards = sorted(step.glob("*.safetensors"))
    for victim in (shards[-1], shards[1]):  # the later one is damaged too, first
        data = bytearray(victim.read_bytes())
        data[-1] ^= 1
        victim.write_bytes(bytes(data))
    live = {"w": {k: torch.zeros_like(v) for k, v in _state().items()}}
    with pytest.raises(sk.CorruptCheckpointError, match=shards[1].name):
        sk.load(tmp_path, live)
    assert all(not t.any() for t in live["w"].values())


def test_a_parse_error_behind_a_bad_checksum_reports_the_checksum(
    tmp_path: Path, fast_paths: None
) -> None:
    _save(tmp_path)
    shard = sorted((tmp_path / "step_000000001").glob("*.safetensors"))[0]
    shard.write_bytes(b"\xff" * shard.stat().st_size)  # same size, unparseable, bad checksum
    with pytest.raises(sk.CorruptCheckpointError, match="checksum mismatch"):
        sk.read(tmp_path)


def test_progress_reaches_the_total_after_verification(tmp_path: Path, fast_paths: None) -> None:
    _save(tmp_path)
    seen: list[tuple[int, int]] = []
    sk.read(tmp_path, progress=lambda done, total: seen.append((done, total)))
    assert len(seen) > 2
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1][0] == seen[-1][1]


def test_staged_small_tensors_of_every_layout_keep_their_values() -> None:
    base = torch.arange(24.0).reshape(4, 6)
    tensors = {
        "contiguous": base.clone(),
        "transposed": base.t(),
        "sliced": base[:, 1:3],
        "conj": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj(),
        "neg": torch._neg_view(torch.tensor([1.0, -2.0])),
        "param": torch.nn.Parameter(torch.ones(3)),
        "bf16": torch.tensor([1.5, 2.5], dtype=torch.bfloat16),
    }
    back = parse(bytearray(b"".join(bytes(c) for c in stream(tensors, layout(tensors)))))
    for name, t in tensors.items():
        assert torch.equal(back[name], t.detach().resolve_conj().resolve_neg()), name


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=6),
        st.tuples(st.sampled_from(["float32", "bool"]), st.lists(st.integers(0, 9), max_size=3)),
        max_size=5,
    )
)
def test_tensor_lines_equal_json_dumps(spec: dict[str, tuple[str, list[int]]]) -> None:
    records = {n: TensorRecord(f"{n}.safetensors", d, tuple(s)) for n, (d, s) in spec.items()}
    expected = [
        f" {_compact(n)}:{_compact({'file': r.file, 'dtype': r.dtype, 'shape': list(r.shape)})}"
        for n, r in sorted(records.items())
    ]
    assert list(_tensor_lines(records)) == expected
