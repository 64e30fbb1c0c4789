"""Training runs for the resume tests; module-level so that child processes can import them."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from statekeeper.averaging import EMA, AveragedModel
from statekeeper.data import ResumableLoader, ResumableSampler, SeededDataset
from statekeeper.testing import Run


def _seed() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)


def mlp_sgd_momentum() -> Run:
    """An MLP with SGD + momentum; data drawn from a registered generator and numpy."""
    _seed()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1)

    def step(i: int) -> None:
        x = torch.randn(4, 8, generator=data) + float(np.random.rand())
        loss = (model(x) - x.sum(1, keepdim=True) * random.random()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return Run({"model": model, "opt": opt}, step, {"data": data})


def mlp_forgets_generator() -> Run:
    """Like mlp_sgd_momentum, but the data generator is not registered: resume must differ."""
    run = mlp_sgd_momentum()
    return Run(run.state, run.step)


def cnn_batchnorm_adam_steplr() -> Run:
    _seed()
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    def step(i: int) -> None:
        x = torch.randn(5, 1, 4, 4)
        y = torch.randint(0, 3, (5,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()

    return Run({"model": model, "opt": opt, "sched": sched}, step)


def cnn_forgets_scheduler() -> Run:
    """The CNN run without its scheduler in the state: resume must differ."""
    run = cnn_batchnorm_adam_steplr()
    return Run({k: v for k, v in run.state.items() if k != "sched"}, run.step)


def transformer_dropout_adamw_warmup_cosine() -> Run:
    _seed()
    layer = nn.TransformerEncoderLayer(
        d_model=16, nhead=2, dim_feedforward=32, dropout=0.2, batch_first=True
    )
    model = nn.Sequential(
        nn.Embedding(20, 16), nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    )
    head = nn.Linear(16, 20)
    params = [*model.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[3])

    def step(i: int) -> None:
        tokens = torch.randint(0, 20, (3, 6))
        logits = head(model(tokens))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 20), tokens.roll(1, 1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()

    return Run({"model": model, "head": head, "opt": opt, "sched": sched}, step)


def autocast_gradscaler() -> Run:
    _seed()
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)

    def step(i: int) -> None:
        x = torch.randn(4, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return Run({"model": model, "opt": opt, "scaler": scaler}, step)


class _Loop:
    """A loader-driven loop that survives epoch boundaries and resumes mid-epoch."""

    def __init__(self, workers: int) -> None:
        _seed()
        data = torch.utils.data.TensorDataset(torch.randn(36, 4), torch.randn(36, 1))
        self.loader = StatefulDataLoader(data, batch_size=4, shuffle=True, num_workers=workers)
        self.model = nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.it: Any = None

    def batch(self) -> Any:
        if self.it is None:
            self.it = iter(self.loader)
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)

    def step(self, i: int) -> None:
        x, y = self.batch()
        loss = (self.model(x) - y).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def run(self) -> Run:
        return Run({"model": self.model, "opt": self.opt, "loader": self.loader}, self.step)


def loader_shuffle() -> Run:
    return _Loop(0).run()


def loader_shuffle_two_workers() -> Run:
    return _Loop(2).run()


class SetOrder(nn.Module):
    """Registers same-shaped parameters in set iteration order: it differs per PYTHONHASHSEED."""

    NAMES = frozenset({"alpha", "beta", "gamma", "delta", "epsilon", "zeta"})

    def __init__(self) -> None:
        super().__init__()
        for name in set(self.NAMES):
            init = torch.full((4,), float(len(name))) + torch.arange(4.0) * ord(name[0]) / 100
            self.register_parameter(name, nn.Parameter(init))

    def forward(self) -> torch.Tensor:
        return sum(
            (getattr(self, n) * (i + 1)).pow(2).sum() for i, n in enumerate(sorted(self.NAMES))
        )


def set_order_adam() -> Run:
    _seed()
    model = SetOrder()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)

    def step(i: int) -> None:
        opt.zero_grad()
        model().backward()
        opt.step()

    return Run({"model": model, "opt": opt}, step)


class _Noisy(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random augmentation inside __getitem__ (torch, numpy and python RNGs)."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(22, 4, generator=gen), torch.randn(22, 1, generator=gen)

    def __len__(self) -> int:
        return 22

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.randn(4) * 0.1 + float(np.random.rand()) * 0.01 + random.random() * 0.01
        return self.x[i] + noise, self.y[i]


def resumable_loader_augmenting() -> Run:
    """A plain DataLoader (2 workers) over an augmenting dataset: 6 batches an epoch."""
    _seed()
    data = SeededDataset(_Noisy(), seed=11)
    loader = ResumableLoader(
        torch.utils.data.DataLoader(
            data, batch_size=4, sampler=ResumableSampler(data, seed=5), num_workers=2
        )
    )
    loop = _Loop(0)
    loop.loader = loader
    return Run({"model": loop.model, "opt": loop.opt, "loader": loader}, loop.step)


def mlp_with_ema() -> Run:
    """An MLP with BatchNorm, Adam, and an EMA of it with warmup (its counters are state)."""
    _seed()
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ema = AveragedModel(
        model, rule=EMA(0.9, warmup_power=0.75, update_after_step=1, every=2), use_buffers=True
    )

    def step(i: int) -> None:
        x = torch.randn(6, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema.update_parameters(model)

    return Run({"model": model, "opt": opt, "ema": ema}, step)
