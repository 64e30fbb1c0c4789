"""Saving through a framework integration against the framework's own default save.

``.venv/bin/python -m bench.integrations [--size-mib 256] [--runs 5]`` builds a model of
about ``--size-mib`` float32 parameters with Adam (one step taken, so three times that in
all) and times, in alternating order, per framework:

- Accelerate: ``Accelerator.save_state(dir)`` (safetensors weights, pickled optimizer and
  RNG, no fsync) against ``statekeeper.integrations.accelerate.save_state`` (one
  checksummed statekeeper step, fsynced); and the same Accelerate save followed by
  ``os.sync()``, so that both are durable when the time stops.

Each save goes to a new directory (removed after the round). Reported: the median (min-max)
per contender and statekeeper's time as a multiple of each Accelerate row's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

MIB = 1 << 20


def _accelerate_rows(args: argparse.Namespace, root: Path) -> dict[str, list[float]]:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from statekeeper.integrations.accelerate import save_state

    width = 1024
    layers = max(1, args.size_mib * MIB // (4 * width * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    opt = torch.optim.Adam(model.parameters())
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(root)))
    model, opt = accelerator.prepare(model, opt)
    accelerator.backward(model(torch.randn(2, width)).sum())
    opt.step()

    def accelerate(durable: bool) -> Any:
        def run(path: Path) -> None:
            accelerator.save_state(str(path))
            if durable:
                os.sync()

        return run

    contenders = {
        "Accelerate save_state": accelerate(False),
        "Accelerate save_state + sync": accelerate(True),
        "statekeeper": lambda path: save_state(accelerator, path, step=0),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.runs + 1):  # the first round warms up
        names = list(contenders)
        k = r % len(names)
        for name in names[k:] + names[:k]:
            path = root / f"{name.split()[0]}-{r}"
            os.sync()
            start = time.perf_counter()
            contenders[name](path)
            elapsed = time.perf_counter() - start
            if r:
                times[name].append(elapsed)
            shutil.rmtree(path, ignore_errors=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="integrations-"))
    try:
        times = _accelerate_rows(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ours = statistics.median(times["statekeeper"])
    print(f"Accelerate, {args.size_mib} MiB of parameters + Adam, {args.runs} rounds:")
    for name, series in times.items():
        median = statistics.median(series)
        print(
            f"  {name:<30} {median:.3f} s ({min(series):.3f}-{max(series):.3f}); "
            f"statekeeper {ours / median:.2f}x"
        )


if __name__ == "__main__":
    main()
