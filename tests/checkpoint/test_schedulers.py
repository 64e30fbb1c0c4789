"""Every LR scheduler family's state round-trips and continues identically."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as S

import statekeeper as sk


class Halving:
    """A callable object: LambdaLR stores its __dict__."""

    def __init__(self) -> None:
        self.factor = 0.5

    def __call__(self, epoch: int) -> float:
        return float(self.factor**epoch)


def _chained(o: torch.optim.Optimizer) -> Any:
    return S.ChainedScheduler([S.ExponentialLR(o, 0.9), S.StepLR(o, 2, 0.5)], optimizer=o)


SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "step": lambda o: S.StepLR(o, 2, 0.5),
    "lambda-object": lambda o: S.LambdaLR(o, Halving()),
    "lambda-function": lambda o: S.LambdaLR(o, lambda e: 0.9**e),
    "sequential": lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, total_iters=2),
                                               S.CosineAnnealingLR(o, 8)], milestones=[2]),
    "chained": _chained,
    "plateau": lambda o: S.ReduceLROnPlateau(o, patience=0, factor=0.5),
    "onecycle": lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=20),
    "cyclic": lambda o: S.CyclicLR(o, 0.01, 0.1, step_size_up=2),
    "warm-restarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3),
    "polynomial": lambda o: S.PolynomialLR(o, total_iters=6),
}  # fmt: skip


def _run(make: Callable[[torch.optim.Optimizer], Any]) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, make(opt)


def _advance(opt: torch.optim.Optimizer, sched: Any, steps: int) -> list[float]:
    lrs = []
    for i in range(steps):
        opt.step()
        if isinstance(sched, S.ReduceLROnPlateau):
            sched.step(1.0 + (i % 2))  # no improvement on odd steps
        else:
            sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_scheduler_resumes_with_the_same_learning_rates(tmp_path: Path, name: str) -> None:
    model, opt, sched = _run(SCHEDULERS[name])
    _advance(opt, sched, 5)
    sk.save(tmp_path, {"model": model, "opt": opt, "sched": sched}, step=5)
    expected = _advance(opt, sched, 6)
    model2, opt2, sched2 = _run(SCHEDULERS[name])
    sk.load(tmp_path, {"model": model2, "opt": opt2, "sched": sched2})
    assert _advance(opt2, sched2, 6) == expected
