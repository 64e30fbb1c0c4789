"""A run restarted from an older step (its newer steps damaged) saves those step numbers
again: each damaged copy is set aside (kept as evidence, listed, never deleted), the run has
a good checkpoint at every step it passes again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import statekeeper as sk
from statekeeper.cli.main import main
from statekeeper.testing import assert_state_equal


def _state(step: int) -> dict[str, object]:
    return {"w": torch.full((64,), float(step)), "epoch": step}


def _flip_a_tensor_byte(step_dir: Path) -> bytes:
    """A bit flip in the step's tensor file (what a bad sector leaves); the damaged bytes."""
    shard = next(step_dir.glob("tensors-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.unlink()  # a file of its own: a hard-linked twin in another step stays intact
    shard.write_bytes(bytes(data))
    return bytes(data)


def test_a_restarted_run_saves_again_over_its_damaged_steps(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path, every=sk.EverySteps(1)) as ckpt:
        for step in range(1, 5):
            ckpt.maybe_save(step, _state(step))
    damaged = {s: _flip_a_tensor_byte(tmp_path / f"step_{s:09d}") for s in (3, 4)}

    live = _state(0)
    with sk.Checkpointer(tmp_path, every=sk.EverySteps(1)) as ckpt:
        with pytest.warns(sk.StatekeeperWarning, match="skipping damaged step"):
            assert ckpt.restore_latest(live) == 2
        with pytest.warns(sk.StatekeeperWarning, match="step 3 .* was damaged.*set aside"):
            assert ckpt.maybe_save(3, _state(30)) is not None  # not refused
        with pytest.warns(sk.StatekeeperWarning, match="step 4 .* was damaged.*set aside"):
            assert ckpt.save(4, _state(40)).step == 4  # nor without overwrite=
        assert ckpt.maybe_save(4, _state(41)) is None  # a good step 4 exists now

    assert [i.step for i in sk.list_checkpoints(tmp_path)] == [1, 2, 3, 4]
    assert all(i.error is None for i in sk.list_checkpoints(tmp_path))
    assert sk.audit.verify(tmp_path, step=3).ok and sk.audit.verify(tmp_path, step=4).ok
    for step, new in ((3, 30), (4, 40)):
        assert_state_equal({"w": sk.read(tmp_path, step=step)["w"]}, {"w": _state(new)["w"]})
        (aside,) = tmp_path.glob(f"step_{step:09d}.damaged-*")  # the evidence, unchanged
        assert next(aside.glob("tensors-*.safetensors")).read_bytes() == damaged[step]

    sk.audit.remove_partial(tmp_path)  # clean-up keeps the evidence
    with sk.Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore_latest(_state(0)) == 4  # and resume never reads it
    assert len(list(tmp_path.glob("step_*.damaged-*"))) == 2
    data = json.loads(CliRunner().invoke(main, ["ls", str(tmp_path), "--json"]).stdout)
    assert [(e["step"], e["kind"]) for e in data["set_aside"]] == [(3, "damaged"), (4, "damaged")]
    assert data["partial"] == []
