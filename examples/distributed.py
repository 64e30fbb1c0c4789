"""Two processes train an FSDP2 model, stop, and resume bit for bit.

``python examples/distributed.py`` launches itself on 2 CPU ranks (gloo), three times, each
a fresh set of processes:

1. reference: train STEPS steps without stopping, and remember every rank's losses;
2. interrupted: train, save through the Checkpointer at step STOP, and exit;
3. resumed: new processes restore the newest step and train to the end.

The losses of (3) must equal those of (1) on every rank, bit for bit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import statekeeper as sk

STEPS, STOP = 8, 4


def build(world: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def rank_main(phase: str, run: Path) -> list[float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = build(world)
    torch.manual_seed(1234 + rank)  # each rank draws its own data
    state = {"model": model, "opt": opt}
    losses: list[float] = []
    with sk.Checkpointer(run, keep=sk.KeepLatest(2), every=sk.EverySteps(STOP)) as ckpt:
        start = (ckpt.restore_latest(state) or 0) if phase == "resumed" else 0
        for step in range(start, STEPS):
            x = torch.randn(8, 16)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            if phase == "interrupted":
                ckpt.maybe_save(step + 1, state)
                if step + 1 == STOP:
                    break
    return losses


def launch(phase: str, run: Path, out: Path, world: int = 2) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(world)}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, phase, str(run), str(out)], env={**env, "RANK": str(r)}
        )
        for r in range(world)
    ]
    if any(p.wait(timeout=300) != 0 for p in procs):
        raise SystemExit(f"phase {phase} failed")


def main() -> None:
    if len(sys.argv) == 4:  # one rank of a phase
        phase, run, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
        dist.init_process_group("gloo")
        losses = rank_main(phase, run)
        (out / f"{phase}-{dist.get_rank()}.json").write_text(json.dumps(losses))
        dist.destroy_process_group()
        # torch keeps objects owning gloo threads (the device mesh, FSDP state) past
        # destroy_process_group; tearing them down with the interpreter can abort a rank
        # whose work is done ("terminate called without an active exception"): leave now
        sys.stdout.flush()
        os._exit(0)
    with tempfile.TemporaryDirectory() as tmp:
        run, out = Path(tmp) / "run", Path(tmp)
        launch("reference", Path(tmp) / "reference-run", out)
        launch("interrupted", run, out)
        print("saved:", [f"step {i.step}" for i in sk.list_checkpoints(run)])
        launch("resumed", run, out)
        for rank in range(2):
            reference = json.loads((out / f"reference-{rank}.json").read_text())
            first = json.loads((out / f"interrupted-{rank}.json").read_text())
            resumed = json.loads((out / f"resumed-{rank}.json").read_text())
            if first + resumed != reference:
                raise SystemExit(f"rank {rank}: the resumed run differs from the reference")
            print(f"rank {rank}: losses after resume are bitwise identical ({len(resumed)} steps)")


if __name__ == "__main__":
    main()
