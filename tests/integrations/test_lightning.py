"""Lightning saving through statekeeper: a run killed mid-way and resumed through
``trainer.fit(..., ckpt_path="last")`` ends bitwise identical to one that never stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.helpers.framework_runs import run_to_end

import statekeeper as sk


def _run(where: Path, out: Path, every: int, kill: int, *more: str) -> int:
    return run_to_end("lightning_run", where, out, every, kill, *more)


@pytest.mark.parametrize(("every", "kill", "last"), [(3, 13, 12), (4, 17, 16)])
def test_a_killed_lightning_run_resumes_bitwise(
    tmp_path: Path, every: int, kill: int, last: int
) -> None:
    assert _run(tmp_path / "straight", tmp_path / "straight.st", every, 0) == 0
    where = tmp_path / "killed"
    assert _run(where, tmp_path / "unused.st", every, kill) == -9
    assert [i.step for i in sk.list_checkpoints(where / "last.ckpt")] == [last]
    assert sk.verify(where / "last.ckpt").ok  # each checkpoint is a statekeeper run
    assert _run(where, tmp_path / "resumed.st", every, 0, "resume") == 0
    a = load_file(str(tmp_path / "straight.st"))
    b = load_file(str(tmp_path / "resumed.st"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_hyper_parameters_are_stored_plain_or_refused_by_name(tmp_path: Path) -> None:
    from pytorch_lightning.utilities.parsing import AttributeDict

    from statekeeper.integrations.lightning import StatekeeperCheckpointIO

    io = StatekeeperCheckpointIO()
    checkpoint = {"global_step": 3, "hyper_parameters": AttributeDict(lr=0.1, layers=[2, 3])}
    io.save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    got = io.load_checkpoint(tmp_path / "a.ckpt")
    assert got["hyper_parameters"] == {"lr": 0.1, "layers": [2, 3]} and got["global_step"] == 3
    io.save_checkpoint({"global_step": 4}, tmp_path / "a.ckpt")  # the same name again
    assert [i.step for i in sk.list_checkpoints(tmp_path / "a.ckpt")] == [4]
    with pytest.raises(sk.UnsupportedValueError, match="hyper_parameters/fn"):
        io.save_checkpoint({"global_step": 1, "hyper_parameters": {"fn": len}}, tmp_path / "b")
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()
