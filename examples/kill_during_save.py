"""Kill a save half-way and show that nothing is lost: ls, inspect, verify, load.

Run with ``.venv/bin/python examples/kill_during_save.py`` (after ``scripts/setup``). Steps:

1. train a small model and save two checkpoints (steps 100 and 200);
2. start a save of step 300 in another process and SIGKILL it half-way through;
3. show ``statekeeper ls`` (the interrupted save is flagged, never read), ``inspect`` and
   ``verify``; load the newest checkpoint into fresh objects and compare bitwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import statekeeper as sk

RUN_DIR = Path(__file__).resolve().parents[1] / "demo-run" / "kill-during-save"


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> float:
    gen = torch.Generator().manual_seed(0)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss.item()


def big_save(directory: str) -> None:
    """Child process: save a ~400 MB state slowly enough to be killed half-way."""
    state = {f"layer{i}": torch.full((1024, 1024), float(i)) for i in range(100)}
    sk.save(directory, {"model": state}, step=300, shard_bytes=8 << 20)


def kill_half_way() -> None:
    child = subprocess.Popen([sys.executable, __file__, "--child", str(RUN_DIR)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        partial = [p for p in RUN_DIR.glob("step_000000300.partial-*") if p.is_dir()]
        if partial and len(list(partial[0].glob("tensors-*"))) >= 10:
            os.kill(child.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    child.wait()
    print(f"\n$ kill -9 <saver>   (step 300 save killed half-way, exit code {child.returncode})")


def cli(*args: str) -> None:
    exe = Path(sys.executable).with_name("statekeeper")
    print(f"\n$ statekeeper {' '.join(args)}", flush=True)
    subprocess.run([str(exe), *args], check=False)


def main() -> int:
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    RUN_DIR.parent.mkdir(exist_ok=True)
    model, opt = build(0)
    for step in (100, 200):
        loss = train(model, opt, 100)
        info = sk.save(
            RUN_DIR, {"model": model, "opt": opt, "step": step}, step=step, metrics={"loss": loss}
        )
        print(f"saved step {step}: {info.bytes:,} bytes, loss {loss:.4f} -> {info.path}")
    kill_half_way()
    cli("ls", str(RUN_DIR))
    cli("inspect", str(RUN_DIR))
    cli("verify", str(RUN_DIR))
    fresh_model, fresh_opt = build(1)
    restored = sk.load(RUN_DIR, {"model": fresh_model, "opt": fresh_opt, "step": 0})
    same = all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values(), strict=True)
    )
    print(
        f"\nloaded step {restored.step} (the newest committed one) into a fresh model: "
        f"{'bitwise identical' if same else 'DIFFERENT'} to the model that saved it"
    )
    removed = sk.audit.remove_partial(RUN_DIR)
    print(f"removed the interrupted save: {', '.join(removed) or 'nothing'}")
    return 0 if same and restored.step == 200 else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        big_save(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
