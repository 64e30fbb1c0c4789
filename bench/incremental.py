"""Incremental saves of a LoRA-shaped state: time and bytes written per save.

``.venv/bin/python -m bench.incremental [--base-mib 1024] [--adapter-mib 10] [--saves 10]
[--json]`` builds a frozen base (``--base-mib`` of float32 weights in 16 linear layers,
``requires_grad=False``) with a trainable low-rank adapter per layer (``--adapter-mib`` in
all) and Adam over the adapters, then saves ``--saves`` times in a row, one training step
before each round. Every round saves the same state with each contender, in an order
rotated from round to round, each durably (fsynced files and directories):

- ``sk incremental``: ``Checkpointer(..., keep=KeepLatest(2))``, the default
  (``Incremental.REUSE``): unchanged files of an earlier step are hard-linked, each read
  and checked first, the frozen shard hashed from the live tensors at every save (the
  second save is written whole: a second copy that shares no data);
- ``sk trust_marks``: the same with ``Incremental.TRUST_MARKS`` (marks and fingerprints
  trusted: no hash, no read, where this process saw nothing change);
- ``sk full``: the same with ``Incremental.WRITE_ALL``;
- ``safetensors``: ``save_file`` of every tensor (model and Adam state) into a new file;
- ``torch.save``: ``{"model": ..., "optim": ...}`` into a new file;
- ``DCP``: ``torch.distributed.checkpoint.save`` into a new directory.

Each contender keeps its last two saves on disk (the others are deleted, untimed). The
report gives per contender the first save and the median (min-max) of the others: time and
bytes written (statekeeper: ``CheckpointInfo.written``; the others: the bytes of their
files). The targets: statekeeper's incremental saves after the first write at most 5% of
the full state's bytes and take at most 0.15x the time of a full durable save (``sk full``,
the same rounds).
"""

from __future__ import annotations

import argparse
import contextlib
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
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

import statekeeper as sk
from bench.io import fsync_dir, fsync_file

MIB = 1 << 20
LAYERS = 16


class LoRALinear(torch.nn.Module):
    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        self.base = torch.nn.Linear(width, width, bias=False)
        self.base.requires_grad_(False)
        self.down = torch.nn.Linear(width, rank, bias=False)
        self.up = torch.nn.Linear(rank, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + self.up(self.down(x))
        return out


def build(base_mib: int, adapter_mib: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    width = int((base_mib * MIB / 4 / LAYERS) ** 0.5)
    rank = max(1, adapter_mib * MIB // (4 * LAYERS * 2 * width))
    model = torch.nn.Sequential(*(LoRALinear(width, rank) for _ in range(LAYERS)))
    trainable = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.Adam(trainable, lr=1e-3)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    width = model[0].base.in_features
    model(torch.randn(2, width)).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _flat_tensors(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for pid, state in opt.state_dict()["state"].items():
        out.update({f"optim.{pid}.{k}": v for k, v in state.items() if torch.is_tensor(v)})
    return out


def contenders(
    root: Path, model: torch.nn.Module, opt: torch.optim.Optimizer
) -> dict[str, Callable[[int], int]]:
    """name -> save(step) returning the bytes it wrote."""
    state = {"model": model, "optim": opt}
    incremental = sk.Checkpointer(root / "sk-incremental", keep=sk.KeepLatest(2))
    trusting = sk.Checkpointer(
        root / "sk-trust", keep=sk.KeepLatest(2), incremental=sk.Incremental.TRUST_MARKS
    )
    full = sk.Checkpointer(
        root / "sk-full", keep=sk.KeepLatest(2), incremental=sk.Incremental.WRITE_ALL
    )

    def sk_save(ckpt: sk.Checkpointer) -> Callable[[int], int]:
        def save(step: int) -> int:
            info = ckpt.save(step, state)
            assert isinstance(info, sk.CheckpointInfo)
            return info.written

        return save

    def in_new(name: str, write: Callable[[Path], None]) -> Callable[[int], int]:
        folder = root / name
        folder.mkdir()

        def save(step: int) -> int:
            path = folder / f"step-{step}"
            write(path)
            fsync_dir(folder)
            for old in folder.glob("step-*"):  # keep the last two, as the Checkpointers do
                if int(old.name.split("-")[1]) < step - 1:
                    shutil.rmtree(old) if old.is_dir() else old.unlink()
            return _size(path)

        return save

    def safetensors_save(path: Path) -> None:
        save_file(_flat_tensors(model, opt), str(path))
        fsync_file(path)

    def torch_save(path: Path) -> None:
        with open(path, "wb") as f:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())

    def dcp_save(path: Path) -> None:
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=path)
        fsync_file(path)

    return {
        "sk incremental": sk_save(incremental),
        "sk trust_marks": sk_save(trusting),
        "sk full": sk_save(full),
        "safetensors": in_new("safetensors", safetensors_save),
        "torch.save": in_new("torch", torch_save),
        "DCP": in_new("dcp", dcp_save),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    model, opt = build(args.base_mib, args.adapter_mib)
    frozen = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
    root = Path(tempfile.mkdtemp(prefix="incremental-", dir=args.dir))
    try:
        saves = contenders(root, model, opt)
        names = list(saves)
        times: dict[str, list[float]] = {n: [] for n in names}
        written: dict[str, list[int]] = {n: [] for n in names}
        for step in range(1, args.saves + 1):
            train(model, opt)
            k = step % len(names)
            for name in names[k:] + names[:k]:
                os.sync()  # the last contender's writes are on disk before the next starts
                start = time.perf_counter()
                nbytes = saves[name](step)
                times[name].append(time.perf_counter() - start)
                written[name].append(nbytes)
        full_state = written["sk full"][-1]
        return {
            "frozen_bytes": frozen,
            "state_bytes": full_state,
            "times": times,
            "written": written,
            "loadavg": os.getloadavg(),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(result: dict[str, Any]) -> None:
    state = result["state_bytes"]
    print(
        f"LoRA-shaped state: {state / MIB:.0f} MiB per save ({result['frozen_bytes'] / MIB:.0f} "
        f"MiB frozen), {len(result['times']['sk full'])} saves; load average "
        f"{result['loadavg'][0]:.2f}"
    )
    print(f"{'contender':<16} {'1st save':>10} {'saves 2..n: time (min-max)':>30} {'written':>12}")
    for name, series in result["times"].items():
        later = series[1:]
        wrote = result["written"][name][1:]
        print(
            f"{name:<16} {series[0]:>9.3f}s {statistics.median(later):>14.3f}s "
            f"({min(later):.3f}-{max(later):.3f}) {statistics.median(wrote) / MIB:>9.1f} MiB"
        )
    inc, full = result["times"]["sk incremental"][1:], result["times"]["sk full"][1:]
    ratio = statistics.median(inc) / statistics.median(full)
    share = statistics.median(result["written"]["sk incremental"][1:]) / state
    print(
        f"sk incremental, saves 2..n: {ratio:.3f}x the time of a full durable save (target "
        f"<= 0.15x), {100 * share:.2f}% of the state's bytes written (target <= 5%)"
    )


def _moto(port: int) -> subprocess.Popen[bytes]:
    """moto's S3 server in a process of its own on 127.0.0.1 (not this process's GIL)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(200):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.05)
    server.kill()
    raise SystemExit("moto's server did not start")


def mirror_rows(args: argparse.Namespace) -> dict[str, Any]:
    """The caller's stall per save: local alone, local with a mirror on S3 (moto's server),
    and straight to S3, the same state, rounds rotated; all incremental."""
    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = _moto(port)
    endpoint = f"http://127.0.0.1:{port}"
    options = {
        "key": "bench",
        "secret": "bench",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    root = Path(tempfile.mkdtemp(prefix="mirror-", dir=args.dir))
    try:
        client = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="bench", aws_secret_access_key="bench",
        )  # fmt: skip
        for bucket in ("mirror", "direct"):
            client.create_bucket(Bucket=bucket)
        model, opt = build(args.mirror_base_mib, args.adapter_mib)
        state = {"model": model, "optim": opt}
        keep = sk.KeepLatest(2)
        mirror = sk.Mirror(sk.storage.FsspecStorage("s3://mirror/run", **options), keep=keep)
        ckpts = {
            "local": sk.Checkpointer(root / "local", keep=keep),
            "local + mirror": sk.Checkpointer(root / "tiered", keep=keep, mirror=mirror),
            "direct to S3": sk.Checkpointer(
                sk.storage.FsspecStorage("s3://direct/run", **options), keep=keep
            ),
        }
        times: dict[str, list[float]] = {n: [] for n in ckpts}
        names = list(ckpts)
        try:
            for step in range(1, args.saves + 1):
                train(model, opt)
                k = step % len(names)
                for name in names[k:] + names[:k]:
                    ckpts["local + mirror"].wait()  # its last upload is done: a quiet start
                    os.sync()
                    start = time.perf_counter()
                    ckpts[name].save(step, state)
                    times[name].append(time.perf_counter() - start)
        finally:
            with contextlib.ExitStack() as stack:  # every one closed, whatever one raises
                for ckpt in ckpts.values():
                    stack.callback(ckpt.close)
        return {"times": times, "base_mib": args.mirror_base_mib}
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(root, ignore_errors=True)


def report_mirror(result: dict[str, Any]) -> None:
    times = result["times"]
    print(
        f"\nmirrored saves ({result['base_mib']} MiB frozen base), caller's stall per save, "
        "saves 2..n, median (min-max):"
    )
    for name, series in times.items():
        later = series[1:]
        print(f"  {name:<16} {statistics.median(later):.3f}s ({min(later):.3f}-{max(later):.3f})")
    local = statistics.median(times["local"][1:])
    tiered = statistics.median(times["local + mirror"][1:])
    direct = statistics.median(times["direct to S3"][1:])
    print(
        f"  local + mirror: {tiered / local:.2f}x the local save alone (target <= 1.1x); "
        f"direct to S3: {direct / local:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base-mib", type=int, default=1024, help="frozen float32 weights")
    parser.add_argument("--adapter-mib", type=int, default=10, help="trainable weights")
    parser.add_argument("--saves", type=int, default=10)
    parser.add_argument(
        "--dir", default=None, help="where the saves go (a real disk; default: the temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--rows", choices=("all", "saves", "mirror"), default="all")
    parser.add_argument(
        "--mirror-base-mib", type=int, default=256, help="the frozen base of the mirror rows"
    )
    args = parser.parse_args()
    if args.saves < 2:
        parser.error("--saves must be at least 2")
    result = run(args) if args.rows != "mirror" else None
    mirrored = mirror_rows(args) if args.rows != "saves" else None
    if args.json:
        print(json.dumps({"saves": result, "mirror": mirrored}))
        return
    if result is not None:
        report(result)
    if mirrored is not None:
        report_mirror(mirrored)


if __name__ == "__main__":
    main()
