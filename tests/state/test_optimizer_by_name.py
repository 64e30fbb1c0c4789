"""Optimizer state is keyed by parameter name; plain torch keys it by position."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from tests.conftest import trained
from tests.helpers import launcher

import statekeeper as sk

ROOT = Path(__file__).resolve().parents[2]


def test_saved_optimizer_state_is_keyed_by_module_and_parameter_name(tmp_path: Path) -> None:
    model, opt = trained(0)
    sk.save(tmp_path, {"model": model, "opt": opt}, step=1)
    saved = sk.read(tmp_path)["opt"]
    assert set(saved["state"]) == {
        "model/0.weight",
        "model/0.bias",
        "model/2.weight",
        "model/2.bias",
    }
    assert saved["param_groups"][0]["params"] == [
        "model/0.bias",
        "model/0.weight",
        "model/2.bias",
        "model/2.weight",
    ]
    assert saved["shapes"]["model/2.weight"] == [4, 16]


def test_parameters_across_several_modules_are_named_by_their_entry(tmp_path: Path) -> None:
    encoder, head = torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)
    opt = torch.optim.Adam(
        [{"params": encoder.parameters()}, {"params": head.parameters(), "lr": 0.1}]
    )
    head(encoder(torch.ones(1, 2))).sum().backward()
    opt.step()
    sk.save(tmp_path, {"encoder": encoder, "head": head, "opt": opt}, step=1)
    fresh_enc, fresh_head = torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)
    # the fresh optimizer lists the groups' parameters in another order
    fresh_opt = torch.optim.Adam(
        [
            {"params": [fresh_enc.bias, fresh_enc.weight]},
            {"params": [fresh_head.bias, fresh_head.weight], "lr": 0.1},
        ]
    )
    sk.load(tmp_path, {"encoder": fresh_enc, "head": fresh_head, "opt": fresh_opt})
    assert torch.equal(
        fresh_opt.state[fresh_enc.weight]["exp_avg"], opt.state[encoder.weight]["exp_avg"]
    )
    assert torch.equal(
        fresh_opt.state[fresh_head.bias]["exp_avg_sq"], opt.state[head.bias]["exp_avg_sq"]
    )
    assert fresh_opt.param_groups[1]["lr"] == 0.1


def test_a_parameter_outside_the_state_is_refused(tmp_path: Path) -> None:
    _, opt = trained(0)
    with pytest.raises(
        sk.errors.InvalidArgumentError, match="holds parameters of no module in the state"
    ):
        sk.save(tmp_path, {"opt": opt}, step=1)


def test_every_name_and_shape_mismatch_is_listed_and_nothing_loads(tmp_path: Path) -> None:
    model, opt = trained(0)
    sk.save(tmp_path, {"model": model, "opt": opt}, step=1)
    other = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    other.add_module("3", torch.nn.Linear(4, 2))
    other_opt = torch.optim.Adam(other.parameters())
    with pytest.raises(sk.KeyMismatchError) as info:
        sk.load(tmp_path, {"model": other, "opt": other_opt}, strict=sk.Strict.ALLOW_MISSING)
    problems = "\n".join(info.value.problems)
    assert "opt/model/3.weight: missing from checkpoint group 0" in problems
    assert "opt/model/3.bias: missing from checkpoint group 0" in problems
    assert other_opt.state_dict()["state"] == {}
    assert not torch.equal(other[0].weight, model[0].weight)


def _set_order(mode: str, directory: Path, hash_seed: int) -> dict[str, float]:
    out = launcher.run(  # forked from an interpreter started with this PYTHONHASHSEED
        [sys.executable, "-m", "tests.helpers.set_order", mode, str(directory)],
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


@pytest.mark.parametrize("how", ["positional", "by-name"])
def test_set_ordered_parameters_keep_their_moments_across_processes(
    tmp_path: Path, how: str
) -> None:
    saved = _set_order(f"save-{how}", tmp_path, hash_seed=1)
    loaded = _set_order(f"load-{how}", tmp_path, hash_seed=2)
    order_1 = _set_order("order", tmp_path, hash_seed=1)
    order_2 = _set_order("order", tmp_path, hash_seed=2)
    assert list(order_1) != list(order_2), "the hash seeds must give different parameter orders"
    if how == "positional":  # plain torch: moments silently land on other parameters
        assert any(saved[name] != loaded[name] for name in saved)
    else:
        assert saved == loaded
