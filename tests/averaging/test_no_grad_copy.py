"""The averaged copy does not require grad: optimizers and DDP leave it alone."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers import launcher
from torch import nn

import statekeeper as sk

ROOT = Path(__file__).resolve().parents[2]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))


@pytest.mark.parametrize(
    "make",
    [
        lambda m: sk.averaging.AveragedModel(m),
        lambda m: sk.averaging.AveragedModel(m, rule=sk.averaging.EMA(0.99)),
        lambda m: sk.averaging.AveragedModel(m, averaged=_model),
        lambda m: sk.averaging.AveragedModel(m, use_buffers=True).double(),
    ],
    ids=["swa", "ema", "averaged-factory", "after-to"],
)
def test_the_copy_requires_no_grad_and_the_source_keeps_its_own(make: object) -> None:
    model = _model()
    average = make(model)
    assert [p.requires_grad for p in average.parameters()] == [False] * 6
    assert all(p.requires_grad for p in model.parameters())  # the model trains on


def test_an_optimizer_over_a_module_holding_its_ema_steps_only_the_model() -> None:
    holder = nn.Module()
    holder.net = _model()
    holder.ema = sk.averaging.AveragedModel(holder.net, rule=sk.averaging.EMA(0.5))
    trainable = [p for p in holder.parameters() if p.requires_grad]
    assert len(trainable) == len(list(holder.net.parameters()))
    opt = torch.optim.SGD(trainable, lr=0.1)
    holder.net(torch.randn(5, 4)).sum().backward()
    opt.step()
    before = [p.clone() for p in holder.ema.parameters()]
    holder.ema.update_parameters(holder.net)
    moved = [not torch.equal(a, b) for a, b in zip(before, holder.ema.parameters(), strict=True)]
    assert any(moved)  # averaging still writes into the copy (under no_grad)
    assert all(p.grad is None for p in holder.ema.parameters())


def test_loading_a_state_keeps_the_copy_frozen() -> None:
    source = sk.averaging.AveragedModel(_model(), rule=sk.averaging.EMA(0.9))
    target = sk.averaging.AveragedModel(_model(), rule=sk.averaging.EMA(0.9))
    target.load_state_dict(source.state_dict())
    assert not any(p.requires_grad for p in target.parameters())


@pytest.mark.xdist_group("gloo")
def test_ddp_over_a_module_holding_an_ema_raises_no_unused_parameters_error(
    tmp_path: Path,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "tests.helpers.ema_ddp"]
    procs = [
        launcher.Popen([*args, str(r), "2", str(port), str(tmp_path)], cwd=ROOT) for r in range(2)
    ]
    try:
        assert [p.wait(timeout=240) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
    ranks = [json.loads((tmp_path / f"ema-{r}.json").read_text()) for r in range(2)]
    for report in ranks:
        assert report["error"] is None, report["error"]
        assert report["trainable"] == 4 * 8 + 8 + 8 * 1 + 1  # the model's alone
    assert ranks[0]["net"] == ranks[1]["net"]  # DDP kept the replicas in step
    assert ranks[0]["ema"] == ranks[1]["ema"]
    assert ranks[0]["ema"] != ranks[0]["net"]  # an average, not a copy
