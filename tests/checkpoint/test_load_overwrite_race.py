"""A load of ``step_N`` while another process saves ``step_N`` again (overwrite=True: an
atomic exchange of the two versions). Whether the overwrite lands after the manifest was
read (the files then are the new version's) or after the tensor files were opened early
(the manifest then is the new one), the load reads one version, the new one, and never
fails a checksum that mixes the two. The overwrite is placed deterministically, at the
read of the manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import statekeeper as sk
from statekeeper.checkpoint import reader


@pytest.mark.parametrize(
    ("numel", "when"),
    [
        (1000, "after"),  # a small step: its files are opened after its manifest is read
        (2_000_000, "before"),  # 8 MB: its files are opened (and hashed) before the manifest
    ],
)
def test_a_load_that_races_an_overwrite_of_its_step_reads_the_new_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, numel: int, when: str
) -> None:
    run = tmp_path / "run"
    sk.save(run, {"w": torch.ones(numel)}, step=1)
    real = reader.read_manifest
    overwritten: list[int] = []

    def overwrite() -> None:
        if not overwritten:  # the other process's save, once
            overwritten.append(1)
            sk.save(run, {"w": torch.full((numel,), 2.0)}, step=1, overwrite=True)

    def racing(location: Any) -> Any:
        if when == "before":
            overwrite()
        manifest = real(location)
        if when == "after":
            overwrite()
        return manifest

    monkeypatch.setattr(reader, "read_manifest", racing)
    live = {"w": torch.zeros(numel)}
    assert sk.load(run, live, step=1).step == 1
    assert overwritten
    assert torch.equal(live["w"], torch.full((numel,), 2.0))


def test_a_damaged_step_that_nobody_overwrites_is_still_an_error(tmp_path: Path) -> None:
    run = tmp_path / "run"
    sk.save(run, {"w": torch.ones(1000)}, step=1)
    shard = next((run / "step_000000001").glob("tensors-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(sk.CorruptCheckpointError):
        sk.load(run, {"w": torch.zeros(1000)}, step=1)
