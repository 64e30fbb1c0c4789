"""statekeeper demo: a training run is SIGKILLed mid-run, resumes, and ends bitwise identical.

Run with ``scripts/demo`` (it sets up the virtual environment first). Three processes train
the same model on synthetic data for 300 steps:

1. uninterrupted;
2. with a Checkpointer saving every 25 steps, SIGKILLed at step 140 (mid-epoch, between saves);
3. a new process (another PYTHONHASHSEED) that resumes from the newest checkpoint and finishes.

Then the final states of 1 and 3 (model, optimizer, scheduler, data loader, every RNG) are
compared bit for bit, and the run directory is listed with ``statekeeper ls``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

import statekeeper as sk
from statekeeper.testing import first_difference

ROOT = Path(__file__).resolve().parents[1] / "demo-run"
STEPS, KILL_AT = 300, 140
RUNS = ("uninterrupted", "uninterrupted-final", "resumed", "resumed-final")
console = Console(stderr=False)


def build() -> dict[str, Any]:
    """Everything the run needs, built from scratch and seeded."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
    loader = StatefulDataLoader(data, batch_size=32, shuffle=True)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=20)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[20])
    return {"model": model, "opt": opt, "sched": sched, "loader": loader}


def train(run_dir: Path, final_dir: Path, kill_at: int | None) -> None:
    state = build()
    model, opt, sched, loader = state["model"], state["opt"], state["sched"], state["loader"]
    batches = None
    # --- the statekeeper part: five lines in a plain training loop ---
    keep = sk.KeepLatest(2) | sk.KeepBest(1, metric="loss")
    with sk.Checkpointer(run_dir, every=sk.EverySteps(25), keep=keep) as ckpt:
        start = ckpt.restore_latest(state) or 0
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
        ) as bar:
            label = "to be killed" if kill_at else "resumed" if start else "uninterrupted"
            task = bar.add_task(f"  {label:>13}", total=STEPS, completed=start, loss=0.0)
            for step in range(start, STEPS):
                if batches is None:
                    batches = iter(loader)
                try:
                    x, y = next(batches)
                except StopIteration:  # end of an epoch
                    batches = iter(loader)
                    x, y = next(batches)
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                bar.update(task, advance=1, loss=loss.item())
                ckpt.maybe_save(step + 1, state, metrics={"loss": loss.item()})
                if step + 1 == kill_at:
                    bar.stop()
                    console.print(
                        f"  [red]kill -9[/red] at step {kill_at} (last save: step "
                        f"{max(c.step for c in sk.list_checkpoints(run_dir))})"
                    )
                    os.kill(os.getpid(), signal.SIGKILL)
        # the final state, RNG included, for the comparison
        sk.save(final_dir, {**state, "rng": ckpt.rng}, step=STEPS)


def spawn(phase: str, run: str, hash_seed: int) -> int:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    args = [sys.executable, __file__, phase, str(ROOT / run), str(ROOT / f"{run}-final")]
    return subprocess.run(args, env=env, check=False).returncode


def main() -> int:
    for run in RUNS:  # only this demo's own runs: other examples keep theirs under ROOT
        shutil.rmtree(ROOT / run, ignore_errors=True)
    console.print(
        f"Three processes train one model for {STEPS} steps; the second is killed with "
        f"SIGKILL at step {KILL_AT}, and a third resumes it from its newest checkpoint."
    )
    console.print(f"[bold]1. uninterrupted run[/bold] ({STEPS} steps)")
    spawn("train", "uninterrupted", 1)
    console.print(f"[bold]2. a second run, killed at step {KILL_AT}[/bold]")
    code = spawn("kill", "resumed", 2)
    console.print(f"  process exit code {code} (SIGKILL)")
    console.print("[bold]3. a new process resumes from the newest checkpoint[/bold]")
    spawn("train", "resumed", 3)
    a, b = sk.read(ROOT / "uninterrupted-final"), sk.read(ROOT / "resumed-final")
    diff = first_difference(a, b)
    tensors = sum(1 for _ in _tensors(a))
    if diff is None:
        console.print(
            f"\n[bold green]bitwise identical[/bold green]: all {tensors} tensors and every "
            "value of the final state (model, optimizer, scheduler, loader, RNG) match"
        )
    else:
        console.print(f"\n[bold red]DIFFERENT[/bold red] at {diff}")
    console.print(f"\n$ statekeeper ls {ROOT / 'resumed'}")
    subprocess.run(
        [str(Path(sys.executable).with_name("statekeeper")), "ls", str(ROOT / "resumed")],
        check=False,
    )
    return 0 if diff is None else 1


def _tensors(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)
    elif isinstance(tree, list | tuple):
        for v in tree:
            yield from _tensors(v)


if __name__ == "__main__":
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata 0.11
    if len(sys.argv) == 4:
        phase, run_dir, final_dir = sys.argv[1:]
        train(Path(run_dir), Path(final_dir), KILL_AT if phase == "kill" else None)
        sys.exit(0)
    sys.exit(main())
