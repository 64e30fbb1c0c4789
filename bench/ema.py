"""Benchmark: time per EMA update of statekeeper's AveragedModel against the alternatives.

Contenders, each keeping its own averaged copy of the same source model:

- statekeeper: ``sk.averaging.AveragedModel(model, rule=sk.averaging.EMA(0.999),
  use_buffers=True)``;
- torch: ``torch.optim.swa_utils.AveragedModel`` with ``get_ema_multi_avg_fn(0.999)``,
  ``use_buffers=True``;
- timm: ``timm.utils.model_ema.ModelEmaV3(model, decay=0.999)`` (when timm is usable);
- naive: a Python loop ``e.mul_(d).add_(p, alpha=1 - d)`` over the parameters, then a
  ``copy_`` per buffer;
- floor: one ``lerp_`` over one flat float32 tensor holding as many elements as all the
  floating-point parameters and buffers of the model.

Two model shapes: a ResNet-50 built from plain ``nn`` layers (about 25.6M parameters in 161
tensors, BatchNorm buffers) and 700 blocks of ``Linear(64, 64) + LayerNorm(64)`` (2,800 small
tensors). Each contender is warmed up, then all are interleaved round-robin (the starting
contender rotates every round); between rounds the source weights move by ``1e-6`` outside the
timed region. The median time per update is reported. See bench/README.md.

    .venv/bin/python bench/ema.py [--device cuda] [--rounds N] [--json OUT]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel as TorchAveragedModel
from torch.optim.swa_utils import get_ema_multi_avg_fn

import statekeeper as sk

DECAY = 0.999
WARMUP = 3
THREADS = 2


# --------------------------------------------------------------------------- models


class Bottleneck(nn.Module):
    """ResNet-50 bottleneck block (1x1, 3x3, 1x1 convolutions, each followed by BatchNorm)."""

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * 4
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + identity)


def resnet50_shaped() -> nn.Module:
    """torchvision's resnet50() layout from plain layers: 25,557,032 parameters, 161 tensors."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    in_ch = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        stage = []
        for i in range(blocks):
            stage.append(Bottleneck(in_ch, width, stride if i == 0 else 1))
            in_ch = width * 4
        layers.append(nn.Sequential(*stage))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_ch, 1000)]
    return nn.Sequential(*layers)


def many_small(blocks: int = 700, dim: int = 64) -> nn.Module:
    """``blocks`` x (Linear(dim, dim) + LayerNorm(dim)): 4 tensors per block."""
    return nn.Sequential(
        *(nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim)) for _ in range(blocks))
    )


# --------------------------------------------------------------------------- contenders


@dataclass
class Contender:
    name: str
    update: Callable[[], None]
    params: Callable[[], list[Tensor]] | None = None  # averaged parameters, for the check
    times: list[float] = field(default_factory=list)


def load_timm(strict: bool) -> tuple[type[Any] | None, str]:
    """timm's ModelEmaV3 class and a note saying how it was obtained (or why not)."""
    try:
        from timm.utils.model_ema import ModelEmaV3
    except Exception as exc:  # timm's package __init__ needs torchvision
        reason = f"{type(exc).__name__}: {exc}"
    else:
        import timm

        return ModelEmaV3, f"timm {timm.__version__}"
    if strict:
        return None, f"timm: not available ({reason})"
    # timm/utils/model_ema.py itself imports only torch: load that file on its own, without
    # running timm/__init__.py (which imports timm.layers, which imports torchvision).
    try:
        spec = importlib.util.find_spec("timm")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("No module named 'timm'")
        path = os.path.join(next(iter(spec.submodule_search_locations)), "utils", "model_ema.py")
        file_spec = importlib.util.spec_from_file_location("_bench_timm_model_ema", path)
        if file_spec is None or file_spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module: ModuleType = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        cls: type[Any] = module.ModelEmaV3
    except Exception as exc:
        return None, f"timm: not available ({reason}; loading model_ema.py alone: {exc})"
    return cls, (
        f"timm: package import failed ({reason}); ModelEmaV3 loaded from {path} alone "
        "(that file imports only torch), so the timed code is timm's own"
    )


def float_numel(model: nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() for t in tensors if t.is_floating_point())


def make_contenders(
    model: nn.Module, device: torch.device, timm_cls: type[Any] | None
) -> tuple[list[Contender], list[Tensor]]:
    """The contenders, and the extra source tensors to perturb between rounds (the floor's)."""
    contenders: list[Contender] = []

    ska = sk.averaging.AveragedModel(model, rule=sk.averaging.EMA(DECAY), use_buffers=True)
    contenders.append(
        Contender(
            "statekeeper",
            lambda: ska.update_parameters(model),
            lambda: list(ska.module.parameters()),
        )
    )

    tam = TorchAveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(DECAY), use_buffers=True)
    contenders.append(
        Contender(
            "torch swa_utils",
            lambda: tam.update_parameters(model),
            lambda: list(tam.module.parameters()),
        )
    )

    if timm_cls is not None:
        tim = timm_cls(model, decay=DECAY)
        contenders.append(
            Contender(
                "timm ModelEmaV3",
                lambda: tim.update(model),
                lambda: list(tim.module.parameters()),
            )
        )

    naive_model = copy.deepcopy(model)

    def naive() -> None:
        with torch.no_grad():
            for e, p in zip(naive_model.parameters(), model.parameters(), strict=True):
                e.mul_(DECAY).add_(p, alpha=1 - DECAY)
            for eb, b in zip(naive_model.buffers(), model.buffers(), strict=True):
                eb.copy_(b)

    contenders.append(Contender("naive loop", naive, lambda: list(naive_model.parameters())))

    n = float_numel(model)
    flat_avg = torch.zeros(n, dtype=torch.float32, device=device)
    flat_src = torch.randn(n, dtype=torch.float32, device=device)
    contenders.append(
        Contender("floor (1 flat lerp_)", lambda: flat_avg.lerp_(flat_src, 1 - DECAY))
    )
    return contenders, [flat_src]


# --------------------------------------------------------------------------- timing


def run_shape(
    label: str,
    model: nn.Module,
    device: torch.device,
    rounds: int,
    timm_cls: type[Any] | None,
) -> dict[str, Any]:
    model = model.to(device)
    params = list(model.parameters())
    buffers = list(model.buffers())
    float_buffers = [b for b in buffers if b.is_floating_point()]
    contenders, extra = make_contenders(model, device, timm_cls)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def perturb() -> None:
        with torch.no_grad():
            torch._foreach_add_(params + float_buffers + extra, 1e-6)
        sync()

    for c in contenders:
        for _ in range(WARMUP):
            c.update()
    sync()

    k = len(contenders)
    for r in range(rounds):
        perturb()
        for c in contenders[r % k :] + contenders[: r % k]:
            sync()
            t0 = time.perf_counter()
            c.update()
            sync()
            c.times.append(time.perf_counter() - t0)

    medians = {c.name: statistics.median(c.times) for c in contenders}
    floor = medians["floor (1 flat lerp_)"]
    base = medians["statekeeper"]
    reference = contenders[0].params
    assert reference is not None
    ref = reference()
    rows = []
    for c in contenders:
        diff = None
        if c.params is not None:
            diff = max((a - b).abs().max().item() for a, b in zip(c.params(), ref, strict=True))
        rows.append(
            {
                "name": c.name,
                "median_ms": medians[c.name] * 1e3,
                "min_ms": min(c.times) * 1e3,
                "x_floor": medians[c.name] / floor,
                "x_statekeeper": medians[c.name] / base,
                "max_abs_diff_vs_statekeeper": diff,
                "times_ms": [t * 1e3 for t in c.times],
            }
        )
    return {
        "shape": label,
        "params": sum(p.numel() for p in params),
        "param_tensors": len(params),
        "buffers": len(buffers),
        "float_buffer_elements": sum(b.numel() for b in float_buffers),
        "floor_elements": float_numel(model),
        "rounds": rounds,
        "rows": rows,
    }


def print_shape(result: dict[str, Any]) -> None:
    print()
    print(
        f"== {result['shape']}: {result['params']:,} params in {result['param_tensors']} "
        f"tensors, {result['buffers']} buffers, floor over {result['floor_elements']:,} "
        f"float elements; {result['rounds']} rounds"
    )
    header = f"{'contender':<22}{'median ms':>11}{'min ms':>10}{'x floor':>9}{'x sk':>8}"
    print(header + f"{'max|avg-sk|':>14}")
    print("-" * (len(header) + 14))
    for row in result["rows"]:
        diff = row["max_abs_diff_vs_statekeeper"]
        diff_s = "-" if diff is None else f"{diff:.1e}"
        print(
            f"{row['name']:<22}{row['median_ms']:>11.3f}{row['min_ms']:>10.3f}"
            f"{row['x_floor']:>9.2f}{row['x_statekeeper']:>8.2f}{diff_s:>14}"
        )


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="timed rounds per shape (default: 15 for the ResNet-50 shape, 30 for the small one)",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT")
    parser.add_argument(
        "--strict-timm",
        action="store_true",
        help="use timm only through a normal package import (no loading model_ema.py alone)",
    )
    args = parser.parse_args(argv)

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    device = torch.device(args.device)
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    timm_cls, timm_note = load_timm(args.strict_timm)

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none used"
    meta = {
        "torch": torch.__version__,
        "statekeeper": sk.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "gpu": gpu,
        "device": str(device),
        "decay": DECAY,
        "warmup_updates": WARMUP,
        "timm": timm_note,
    }
    print(
        f"EMA update benchmark: torch {meta['torch']}, statekeeper {meta['statekeeper']}, "
        f"python {meta['python']}"
    )
    print(
        f"device {device}; torch threads {meta['threads']}; CPU {meta['cpu']} x{meta['cpu_count']}"
    )
    print(f"GPU: {gpu}")
    print(f"decay {DECAY}; {WARMUP} warm-up updates each; median of round-robin interleaved rounds")
    print(timm_note)

    shapes: list[tuple[str, Callable[[], nn.Module], int]] = [
        ("(a) ResNet-50 shaped", resnet50_shaped, 15),
        ("(b) 700 x [Linear(64,64) + LayerNorm(64)]", many_small, 30),
    ]
    results = []
    for label, build, default_rounds in shapes:
        result = run_shape(label, build(), device, args.rounds or default_rounds, timm_cls)
        print_shape(result)
        results.append(result)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "shapes": results}, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
