"""Multi-process save and load: statekeeper against DCP's own FileSystemWriter/Reader.

``.venv/bin/python -m bench.dist_io [--world 2] [--size-mib 256] [--runs 5] [--warmup 1]
[--rows all|sync|async] [--device cpu|cuda]`` launches ``--world`` ranks (gloo; with
``--device cuda`` one GPU per rank, NCCL for the model). Each builds the same FSDP2 model
(about ``--size-mib`` of float32 parameters, plus Adam's two moments after one step, so
three times that in all), then runs ``--warmup`` untimed rounds and ``--runs`` timed ones. A
round saves with both contenders (statekeeper ``save``,
``torch.distributed.checkpoint.save`` with ``FileSystemWriter``), then loads what each saved
(statekeeper ``load``, DCP ``load`` with ``FileSystemReader`` plus the ``get_*`` /
``set_*_state_dict`` calls around it), into fresh directories that are removed after the
round. Before each load every parameter and moment is changed (untimed); after it each rank
checks, bit for bit, that the saved values are back. The contenders' order alternates from
round to round, so neither always pays for going first after the other's save. A time is the
slowest rank's, barrier to barrier; the report gives per contender the median and the spread
(min-max) over the timed rounds, and statekeeper's time as a multiple of DCP's: the ratio of
the medians and the median (min-max) of the per-round ratios. Below 1.0x statekeeper is
faster. ``--profile DIR`` also writes a cProfile of each rank's saves and loads, per
contender (``sk_load-rank0.pstats``, ...; timed rounds only; the profiler slows the calls,
so the times of such a run are not figures).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

CONTENDERS = ("sk", "dcp")
OPS = ("save", "load")


def _model(world: int, size_mib: int, device: str = "cpu") -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    width = 1024
    layers = max(1, size_mib * (1 << 20) // (4 * width * width))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    model.to(device)
    mesh = init_device_mesh(device, (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _timed(fn: Callable[[], Any], profile: cProfile.Profile | None = None) -> float:
    dist.barrier()
    start = time.perf_counter()
    if profile is None:
        fn()
    else:
        profile.runcall(fn)
    dist.barrier()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's
    return float(elapsed.item())


def _order(round_index: int) -> tuple[str, ...]:
    """The contenders' order in a round: rotated by one each round."""
    k = round_index % len(CONTENDERS)
    return CONTENDERS[k:] + CONTENDERS[:k]


def rank_main(args: argparse.Namespace, root: Path, out: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    import statekeeper as sk

    rank = dist.get_rank()
    model = _model(args.world, args.size_mib, args.device)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 1024, device=args.device)).sum().backward()
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

    def run(who: str, op: str, path: Path) -> Callable[[], Any]:
        if (who, op) == ("sk", "save"):
            return lambda: sk.save(path, state, step=1)
        if (who, op) == ("sk", "load"):
            return lambda: sk.load(path, state)
        if op == "save":
            return lambda: dcp.save(dcp_state(), storage_writer=dcp.FileSystemWriter(str(path)))
        return lambda: dcp_load(path)

    def local_tensors() -> list[torch.Tensor]:
        found = [*dcp_state()["model"].values()]
        found += [v for s in dcp_state()["optim"]["state"].values() for v in s.values()]
        return [t.to_local() if isinstance(t, DTensor) else t for t in found]

    saved = [t.detach().clone() for t in local_tensors()]

    def perturb() -> None:  # so that a load has something to restore
        with torch.no_grad():
            for t in local_tensors():
                t.add_(1)

    def check(who: str) -> None:
        if not all(torch.equal(a, b) for a, b in zip(local_tensors(), saved, strict=True)):
            raise SystemExit(f"rank {rank}: {who}'s load did not restore the saved state")

    keys = [f"{who}_{op}" for who in CONTENDERS for op in OPS]
    profiles = {key: cProfile.Profile() for key in keys} if args.profile else {}
    times: dict[str, list[float]] = {key: [] for key in keys}
    orders: list[list[str]] = []
    size = 0
    for r in range(args.warmup + args.runs if args.rows != "async" else 0):
        timed = r >= args.warmup
        order = _order(r)
        paths = {who: root / f"{who}-{r}" for who in CONTENDERS}
        for op in OPS:
            for who in order:
                if op == "load":
                    perturb()
                profile = profiles.get(f"{who}_{op}") if timed else None
                t = _timed(run(who, op, paths[who]), profile)
                if op == "load":
                    check(who)
                if timed:
                    times[f"{who}_{op}"].append(t)
        if timed:
            orders.append(list(order))
        dist.barrier()
        if rank == 0:
            size = sum(p.stat().st_size for p in paths["sk"].rglob("*") if p.is_file())
            for path in paths.values():
                shutil.rmtree(path, ignore_errors=True)
        dist.barrier()
    for key, profile in profiles.items():
        profile.dump_stats(str(Path(args.profile) / f"{key}-rank{rank}.pstats"))
    background = None
    if args.rows != "sync":
        background = _async_rows(args, root, rank, state, dcp_state, local_tensors)
    if rank == 0:
        result = {"times": times, "orders": orders, "bytes": size, "async": background}
        (out / "result.json").write_text(json.dumps(result))


def _async_rows(
    args: argparse.Namespace,
    root: Path,
    rank: int,
    state: dict[str, Any],
    dcp_state: Callable[[], dict[str, Any]],
    local_tensors: Callable[[], list[torch.Tensor]],
) -> dict[str, Any]:
    """Background saves: each rank's caller stall (until the state may change again) and
    the time until the step is committed, against the floor of a stall, a plain copy of
    this rank's tensors (listed beforehand) into preallocated buffers (pinned, from a GPU),
    and against DCP's ``async_save``: its default and its ``DefaultStager`` (staging in the
    background; its stall lasts until ``staging_completion``). The four take turns, the
    order rotating per round; before each, every rank syncs the file system (no writeback
    of the last one's files during the next), meets the others and collects garbage."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    import statekeeper as sk

    cuda = args.device == "cuda"
    sources = local_tensors()
    buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda) for t in sources]

    def copy() -> None:
        with torch.no_grad():
            torch._foreach_copy_(buffers, sources, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()

    # one stager for every round, as a training loop keeps one: it reuses its staging memory
    stager = DefaultStager(StagingOptions(cuda, False, True, cuda))  # pinned, no shm, async

    run_dir = root / "sk-async"
    ckpt = sk.Checkpointer(run_dir, blocking=False)
    who_all = ("copy", "sk", "dcp", "dcp_stager")
    times: dict[str, list[float]] = {"copy": []}
    for who in who_all[1:]:
        times |= {f"{who}_stall": [], f"{who}_commit": []}
    errors: dict[str, str] = {}
    size = 0
    copy()  # the buffers' pages are touched before any timing
    for r in range(args.warmup + args.runs):
        timed = r >= args.warmup
        k = r % len(who_all)
        for who in who_all[k:] + who_all[:k]:
            if who in errors:
                continue
            os.sync()  # the last contender's files are on disk: no writeback during the next
            dist.barrier()
            gc.collect()
            path = str(root / f"dcp-async-{who}-{r}")
            start = time.perf_counter()
            try:
                if who == "copy":
                    copy()
                    if timed:
                        times["copy"].append(time.perf_counter() - start)
                    continue
                if who == "sk":
                    pending: Any = ckpt.save(r + 1, state)
                    stall = time.perf_counter() - start
                    pending.wait()
                elif who == "dcp":
                    writer = dcp.FileSystemWriter(path)
                    pending = dcp.async_save(dcp_state(), storage_writer=writer)
                    stall = time.perf_counter() - start
                    pending.result()
                else:
                    writer = dcp.FileSystemWriter(path)
                    response = dcp.async_save(
                        dcp_state(), storage_writer=writer, async_stager=stager
                    )
                    if isinstance(response, Future):  # pragma: no cover - torch's choice
                        raise TypeError("async_save with a stager returned a bare Future")
                    response.staging_completion.result()  # the state may change from here
                    stall = time.perf_counter() - start
                    response.upload_completion.result()
                commit = time.perf_counter() - start
            except Exception as exc:  # reported, not fatal: the other rows stand
                errors[who] = f"{type(exc).__name__}: {exc}"[:300]
            failed = torch.tensor([int(who in errors)])
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)  # every rank drops it, or none
            if int(failed):
                errors.setdefault(who, "failed on another rank")
                continue
            if timed:
                times[f"{who}_stall"].append(stall)
                times[f"{who}_commit"].append(commit)
        dist.barrier()
        if rank == 0:
            steps = list(run_dir.glob("step_*"))
            size = sum(f.stat().st_size for d in steps for f in d.rglob("*") if f.is_file())
            for found in [*steps, *root.glob("dcp-async-*")]:
                shutil.rmtree(found, ignore_errors=True)
        dist.barrier()
    ckpt.close()
    stager.close()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, times)
    every_errors = [None] * dist.get_world_size()
    dist.all_gather_object(every_errors, errors)
    return {"per_rank": every, "errors": every_errors, "bytes": size}


def _summary(times: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, values in times.items():
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    for op in OPS:
        sk_t, dcp_t = times[f"sk_{op}"], times[f"dcp_{op}"]
        paired = [s / d for s, d in zip(sk_t, dcp_t, strict=True)]
        out[f"{op}_ratio"] = {
            "of_medians": statistics.median(sk_t) / statistics.median(dcp_t),
            "paired_median": statistics.median(paired),
            "paired_min": min(paired),
            "paired_max": max(paired),
        }
    return out


def _launch(args: argparse.Namespace) -> dict[str, Any]:
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
        result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--size-mib", type=int, default=256, help="float32 parameters per model")
    parser.add_argument("--runs", type=int, default=5, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--profile", metavar="DIR", help="cProfile each call, per rank")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help=(
        "where the model lives; cuda: one GPU per rank (--world at most the GPU count), "
        "NCCL for the model and gloo for the checkpoints' collectives"
    ))  # fmt: skip
    parser.add_argument("--rows", choices=("all", "sync", "async"), default="all")
    args = parser.parse_args()
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be at least 1 and --warmup at least 0")
    if "RANK" in os.environ:  # one rank of the job
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ["RANK"]) % torch.cuda.device_count())
        dist.init_process_group("cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo")
        try:
            rank_main(args, Path(os.environ["BENCH_ROOT"]), Path(os.environ["BENCH_OUT"]))
        finally:
            dist.destroy_process_group()
        return
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    result = _launch(args)
    load_after = os.getloadavg()[0]
    summary = _summary(result["times"]) if args.rows != "async" else {}
    if args.json:
        print(json.dumps({"summary": summary, "loadavg": [load_before, load_after], **result}))
        return
    mib = (result["bytes"] or (result["async"] or {}).get("bytes", 0)) / (1 << 20)
    print(
        f"world {args.world} on {args.device}, {mib:.0f} MiB per checkpoint (model + Adam), "
        f"{args.warmup} warm-up + {args.runs} timed rounds, order alternating; "
        f"load average {load_before:.2f} before, {load_after:.2f} after"
    )
    for op in OPS if summary else ():
        cells = []
        for who, label in (("sk", "statekeeper"), ("dcp", "DCP")):
            s = summary[f"{who}_{op}"]
            cells.append(f"{label} {s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f})")
        ratio = summary[f"{op}_ratio"]
        print(
            f"{op}: {', '.join(cells)}; sk/DCP {ratio['of_medians']:.2f}x of medians, "
            f"per round {ratio['paired_median']:.2f}x "
            f"({ratio['paired_min']:.2f}-{ratio['paired_max']:.2f})"
        )
    if result["async"] is not None:
        _print_async(result["async"], args.device)


def _spread(values: list[float]) -> str:
    return f"{min(values):.4f}-{max(values):.4f}"


def _print_async(background: dict[str, Any], device: str) -> None:
    floor = "pinned device-to-host copy" if device == "cuda" else "copy into buffers"
    print(
        "background saves, per rank, median (min-max) s: stall until the state may change "
        f"again, as a multiple of a plain {floor} of the rank's tensors; commit"
    )
    for rank, times in enumerate(background["per_rank"]):
        med = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
        print(f"  rank {rank}: copy {med['copy']:.4f} ({_spread(times['copy'])})")
        for who, label in (
            ("sk", "statekeeper"),
            ("dcp", "DCP async_save"),
            ("dcp_stager", "DCP async_save + DefaultStager"),
        ):
            stalls = times[f"{who}_stall"]
            if not stalls:
                continue
            print(
                f"    {label}: stall {med[who + '_stall']:.4f} ({_spread(stalls)}) = "
                f"{med[who + '_stall'] / med['copy']:.2f}x copy; commit {med[who + '_commit']:.3f}"
            )
        for rival in ("dcp", "dcp_stager"):
            if times[f"{rival}_stall"]:
                print(
                    f"    statekeeper/{rival} stall: {med['sk_stall'] / med[rival + '_stall']:.2f}x"
                )
    for rank, errors in enumerate(background["errors"]):
        for who, error in errors.items():
            print(f"  {who} failed on rank {rank}: {error}")


if __name__ == "__main__":
    main()
