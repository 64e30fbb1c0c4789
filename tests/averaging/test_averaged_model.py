"""statekeeper.averaging.AveragedModel against torch's, on what torch gets right and what it
gets wrong."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import swa_utils as T

import statekeeper as sk


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _train(model: nn.Module, avgs: list[Any], steps: int = 5) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model(torch.randn(6, 4, generator=gen)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        for avg in avgs:
            avg.update_parameters(model)


def _pairs(
    kind: str, use_buffers: bool, model: nn.Module
) -> tuple[Any, sk.averaging.AveragedModel]:
    if kind == "ema":
        theirs = T.AveragedModel(
            model, multi_avg_fn=T.get_ema_multi_avg_fn(0.9), use_buffers=use_buffers
        )
        return theirs, sk.averaging.AveragedModel(
            model, rule=sk.averaging.EMA(0.9), use_buffers=use_buffers
        )
    if kind == "ema-fn":  # the same helper functions, statekeeper's versions
        theirs = T.AveragedModel(
            model, multi_avg_fn=T.get_ema_multi_avg_fn(0.9), use_buffers=use_buffers
        )
        ours = sk.averaging.AveragedModel(
            model, multi_avg_fn=sk.averaging.get_ema_multi_avg_fn(0.9), use_buffers=use_buffers
        )
        return theirs, ours
    return T.AveragedModel(model, use_buffers=use_buffers), sk.averaging.AveragedModel(
        model, use_buffers=use_buffers
    )


@pytest.mark.parametrize("use_buffers", [False, True])
@pytest.mark.parametrize("kind", ["ema", "ema-fn", "swa"])
def test_matches_torch_on_everything_torch_gets_right(kind: str, use_buffers: bool) -> None:
    model = _mlp()
    theirs, ours = _pairs(kind, use_buffers, model)
    _train(model, [theirs, ours])
    a, b = theirs.state_dict(), ours.state_dict()
    assert set(a) <= set(b) and set(b) - set(a) == {"n_calls"}
    for key, value in a.items():
        if key == "module.1.num_batches_tracked" and use_buffers:
            continue  # torch's defect, tested below
        if kind == "swa":
            torch.testing.assert_close(b[key], value, rtol=0, atol=1e-7)
        else:
            assert torch.equal(b[key], value), key
    assert int(ours.n_averaged) == 5
    x = torch.randn(3, 4)
    ours.eval()
    theirs.eval()
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-6)


def test_integer_buffers_are_copied_where_torch_truncates_them() -> None:
    model = _mlp()
    theirs, ours = _pairs("ema", True, model)
    _train(model, [theirs, ours])
    assert int(model[1].num_batches_tracked) == 5
    assert int(theirs.module[1].num_batches_tracked) == 1  # torch: averaged and truncated
    assert int(ours.module[1].num_batches_tracked) == 5


def test_a_model_of_another_structure_is_an_error_not_a_truncation() -> None:
    model = _mlp()
    other = nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2), nn.Linear(2, 2)
    )
    theirs = T.AveragedModel(model)
    theirs.update_parameters(other)  # torch zips and silently drops the extra layer
    ours = sk.averaging.AveragedModel(model)
    with pytest.raises(sk.KeyMismatchError, match=r"parameter 4\.weight: in the model, not in"):
        ours.update_parameters(other)
    reshaped = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.raises(sk.KeyMismatchError, match=r"3\.weight: torch.float32\(3, 8\) in the model"):
        ours.update_parameters(reshaped)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight


def test_tied_parameters_are_updated_once() -> None:
    torch.manual_seed(0)
    model = Tied()
    ema = sk.averaging.AveragedModel(model, rule=sk.averaging.EMA(0.5))
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    first = model.embed.weight.detach().clone()
    ema.update_parameters(model)  # first update copies
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    ema.update_parameters(model)
    expected = torch.lerp(first, model.embed.weight.detach(), 0.5)  # twice: 0.75 of the way
    assert ema.module.head.weight is ema.module.embed.weight
    torch.testing.assert_close(ema.module.embed.weight, expected, rtol=0, atol=0)
    # iterating the state_dict (how several EMA libraries do it) would visit the weight twice
    assert (
        list(model.state_dict()).count("embed.weight")
        + list(model.state_dict()).count("head.weight")
        == 2
    )


class WithCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("scale", torch.ones(2), persistent=False)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (sk.averaging.BufferPolicy.COPY, 3.0),
        (sk.averaging.BufferPolicy.AVERAGE, 2.0),
        (sk.averaging.BufferPolicy.IGNORE, 1.0),
    ],
)
def test_non_persistent_buffers_follow_the_policy(
    policy: sk.averaging.BufferPolicy, expected: float
) -> None:
    model = WithCache()
    avg = sk.averaging.AveragedModel(model, rule=sk.averaging.EMA(0.5), buffers=policy)
    model.scale.fill_(3.0)
    avg.update_parameters(model)  # the first update copies averaged tensors
    if policy is sk.averaging.BufferPolicy.AVERAGE:
        model.scale.fill_(1.0)
        avg.update_parameters(model)  # 0.5 * 3 + 0.5 * 1
    assert "scale" not in model.state_dict()
    assert float(avg.module.scale[0]) == expected


def test_ema_warmup_update_after_step_and_every() -> None:
    rule = sk.averaging.EMA(0.99, warmup_power=0.5, min_decay=0.1)
    assert rule.weight(0) == 1.0
    assert 1 - rule.weight(1) == pytest.approx(max(0.1, 1 - 2**-0.5))
    assert 1 - rule.weight(10**8) == pytest.approx(0.99)
    model = nn.Linear(1, 1, bias=False)
    avg = sk.averaging.AveragedModel(
        model, rule=sk.averaging.EMA(0.5, update_after_step=2, every=2)
    )
    values = []
    for v in range(1, 8):
        with torch.no_grad():
            model.weight.fill_(float(v))
        avg.update_parameters(model)
        values.append(avg.module.weight.detach().item())
    # calls 0, 1 copy; averaging at calls 2 (copy: first average), 4, 6; 3 and 5 skipped
    assert values == [1.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.5]
    assert int(avg.n_averaged) == 3 and int(avg.n_calls) == 7


def test_state_dict_round_trip_continues_bitwise() -> None:
    model = _mlp()
    ema = sk.averaging.AveragedModel(model, rule=sk.averaging.EMA(0.9, warmup_power=1.0))
    _train(model, [ema], steps=3)
    fresh = sk.averaging.AveragedModel(_mlp(), rule=sk.averaging.EMA(0.9, warmup_power=1.0))
    fresh.load_state_dict(ema.state_dict())
    twin = copy.deepcopy(model)
    _train(model, [ema], steps=3)
    _train(twin, [fresh], steps=3)
    for key, value in ema.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_construction_without_deepcopy() -> None:
    model = _mlp()
    built = sk.averaging.AveragedModel(model, averaged=_mlp)
    assert built.module is not model
    assert torch.equal(built.module[0].weight, model[0].weight)
    with pytest.raises(sk.KeyMismatchError):
        sk.averaging.AveragedModel(model, averaged=lambda: nn.Linear(4, 2))
    with pytest.raises(sk.errors.InvalidArgumentError, match="separate copy"):
        sk.averaging.AveragedModel(model, averaged=model)


def test_picklable_with_the_default_rules() -> None:
    model = _mlp()
    avg = sk.averaging.AveragedModel(model, rule=sk.averaging.EMA(0.9))
    avg.update_parameters(model)
    clone = pickle.loads(pickle.dumps(avg))  # our own object, in memory
    assert torch.equal(clone.module[0].weight, avg.module[0].weight)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    avg.update_parameters(model)
    clone.update_parameters(model)  # the clone goes on counting: an EMA step, not a first copy
    assert int(clone.n_averaged) == 2
    assert torch.equal(clone.module[0].weight, avg.module[0].weight)


@pytest.mark.parametrize(
    "build",
    [
        lambda m: sk.averaging.AveragedModel(m, rule=sk.averaging.EMA(1.5)),
        lambda m: sk.averaging.AveragedModel(m, rule=sk.averaging.EMA(0.9, min_decay=0.95)),
        lambda m: sk.averaging.AveragedModel(m, rule=sk.averaging.EMA(0.9, every=0)),
        lambda m: sk.averaging.AveragedModel(m, buffers="avg"),
        lambda m: sk.averaging.AveragedModel(
            m, use_buffers=True, buffers=sk.averaging.BufferPolicy.IGNORE
        ),
        lambda m: sk.averaging.AveragedModel(
            m, rule=sk.averaging.SWA(), avg_fn=sk.averaging.get_swa_avg_fn()
        ),
        lambda m: sk.averaging.AveragedModel(m, rule="ema"),
        lambda m: sk.averaging.get_ema_multi_avg_fn(-0.1),
    ],
)
def test_validation_errors_are_clear(build: Callable[[nn.Module], Any]) -> None:
    with pytest.raises(sk.errors.InvalidArgumentError):
        build(_mlp())


def _bn_models() -> list[Callable[[], nn.Module]]:
    def cnn() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten())

    return [_mlp, cnn]


@pytest.mark.parametrize("make", _bn_models(), ids=["mlp-bn1d", "cnn-bn2d"])
def test_update_bn_matches_torch_and_restores_mode_and_momentum(
    make: Callable[[], nn.Module],
) -> None:
    shape = (5, 4) if make is _mlp else (5, 1, 6, 6)
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randn(*shape, generator=gen), torch.zeros(5)) for _ in range(4)]
    theirs, ours = make(), make()
    ours.eval()
    T.update_bn(batches, theirs)
    sk.averaging.update_bn(batches, ours)
    for key, value in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, rtol=0, atol=1e-6)
    assert not ours.training
    assert ours[1].momentum == 0.1
    dicts = [{"x": b[0]} for b in batches]
    third = make()
    sk.averaging.update_bn(dicts, third, input_fn=lambda batch: batch["x"])
    torch.testing.assert_close(third[1].running_mean, ours[1].running_mean, rtol=0, atol=1e-6)
    with pytest.raises(sk.errors.InvalidArgumentError, match="input_fn"):
        sk.averaging.update_bn(dicts, make())


def test_follows_tensors_whose_data_is_swapped_or_converted() -> None:
    model = nn.Linear(3, 3)
    ema = sk.averaging.AveragedModel(model, rule=sk.averaging.EMA(0.5))
    ema.update_parameters(model)
    with torch.no_grad():
        model.weight.data = torch.full_like(model.weight, 10.0)  # new storage, same Parameter
    ema.update_parameters(model)
    assert ema.module.weight.detach().mean().item() > 4.0
    model.double()
    ema.double()  # the copy's storage changes too: the pairing is rebuilt
    with torch.no_grad():
        model.weight.fill_(20.0)
    ema.update_parameters(model)
    assert ema.module.weight.dtype == torch.float64
    assert ema.module.weight.detach().mean().item() > 10.0
    model.weight = nn.Parameter(torch.zeros(3, 3, dtype=torch.float64))  # a new Parameter
    ema.update_parameters(model)
    assert ema.module.weight.detach().mean().item() < 10.0
