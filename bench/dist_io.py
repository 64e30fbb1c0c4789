"""Multi-process save and load: statekeeper against DCP's own FileSystemWriter/Reader.

``.venv/bin/python -m bench.dist_io [--world 2] [--size-mib 256] [--runs 3]`` launches
``--world`` CPU ranks (gloo). Each builds the same FSDP2 model (about ``--size-mib`` of
float32 parameters, plus Adam's two moments after one step, so three times that in all),
then, interleaved for ``--runs`` rounds: statekeeper ``save`` / ``load`` and
``torch.distributed.checkpoint.save`` / ``load`` with their file-system storage, into
fresh directories (fsync'd by both). Times are the slowest rank's, medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def _model(world: int, size_mib: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    width = 1024
    layers = max(1, size_mib * (1 << 20) // (4 * width * width))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _timed(fn: Any) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def rank_main(world: int, size_mib: int, runs: int, root: Path, out: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    import statekeeper as sk

    model = _model(world, size_mib)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 1024)).sum().backward()
    opt.step()
    state = {"model": model, "optim": opt}

    def dcp_state() -> dict[str, Any]:
        return {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, opt),
        }

    def dcp_load(path: Path) -> None:
        sd = dcp_state()
        dcp.load(sd, storage_reader=dcp.FileSystemReader(str(path)))
        set_model_state_dict(model, sd["model"])
        set_optimizer_state_dict(model, opt, sd["optim"])

    times: dict[str, list[float]] = {k: [] for k in ("sk_save", "dcp_save", "sk_load", "dcp_load")}
    for r in range(runs):
        sk_dir, dcp_dir = root / f"sk-{r}", root / f"dcp-{r}"
        writer = dcp.FileSystemWriter(str(dcp_dir))
        times["sk_save"].append(_timed(lambda d=sk_dir: sk.save(d, state, step=1)))
        times["dcp_save"].append(_timed(lambda w=writer: dcp.save(dcp_state(), storage_writer=w)))
        times["sk_load"].append(_timed(lambda d=sk_dir: sk.load(d, state)))
        times["dcp_load"].append(_timed(lambda d=dcp_dir: dcp_load(d)))
    if dist.get_rank() == 0:
        size = sum(p.stat().st_size for p in (root / "sk-0").rglob("*") if p.is_file())
        (out / "result.json").write_text(json.dumps({"times": times, "bytes": size}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    if "RANK" in os.environ:  # one rank of the job
        dist.init_process_group("gloo")
        rank_main(args.world, args.size_mib, args.runs, Path(os.environ["BENCH_ROOT"]),
                  Path(os.environ["BENCH_OUT"]))  # fmt: skip
        dist.destroy_process_group()
        return
    with tempfile.TemporaryDirectory(dir=".") as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
        s.close()
        root, out = Path(tmp) / "runs", Path(tmp)
        root.mkdir()
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": str(args.world),
            "BENCH_ROOT": str(root),
            "BENCH_OUT": str(out),
        }
        command = [sys.executable, "-m", "bench.dist_io", *sys.argv[1:]]
        procs = [subprocess.Popen(command, env={**env, "RANK": str(r)}) for r in range(args.world)]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("a rank failed")
        result = json.loads((out / "result.json").read_text())
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in result["times"].items()}
    if args.json:
        print(json.dumps({"medians_s": med, **result}))
        return
    mib = result["bytes"] / (1 << 20)
    print(f"world {args.world}, {mib:.0f} MiB per checkpoint (model + Adam), {args.runs} rounds")
    for op in ("save", "load"):
        sk_t, dcp_t = med[f"sk_{op}"], med[f"dcp_{op}"]
        print(f"{op}: statekeeper {sk_t:.2f} s, DCP {dcp_t:.2f} s ({dcp_t / sk_t:.2f}x DCP/sk)")


if __name__ == "__main__":
    main()
