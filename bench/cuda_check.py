"""CUDA checks that CPU CI cannot run: loads into CUDA modules through pinned staging.

Run on a machine with a GPU (the device session's prepared script runs this, then
``bench/io_gpu.py``)::

    .venv/bin/python bench/cuda_check.py

It saves a CUDA model (a tensor larger than one 64 MiB staging buffer, a non-contiguous
parameter, bf16, integer buffers, tied weights), loads it with ``statekeeper.load`` into a
freshly built CUDA model, and checks every value bitwise against the saved one, against
``load_state_dict`` and with staging buffers of several sizes; then it times
``statekeeper.load`` against torch's own ``load_state_dict`` from the same CPU tensors.
Exits 1 on any mismatch, 2 without CUDA.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import statekeeper as sk
from statekeeper.checkpoint import direct


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Parameter(torch.randn(5000, 4096))  # 78 MiB: split over the buffers
        self.embed = nn.Embedding(1000, 64)
        self.head = nn.Linear(64, 1000, bias=False)
        self.head.weight = self.embed.weight
        self.low = nn.Parameter(torch.randn(333, 77).to(torch.bfloat16))
        self.t = nn.Parameter(torch.randn(300, 200).t())  # non-contiguous
        self.bn = nn.BatchNorm1d(64)
        self.register_buffer("counter", torch.arange(7, dtype=torch.int64))
        self.small = nn.ParameterList(nn.Parameter(torch.randn(13)) for _ in range(500))


def build(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return Model().cuda()


def same(a: nn.Module, b: nn.Module) -> list[str]:
    sa, sb = a.state_dict(), b.state_dict()
    return [k for k in sa if not torch.equal(sa[k].cpu(), sb[k].cpu())]


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing checked", file=sys.stderr)
        return 2
    failures: list[str] = []
    source = build(0)
    with tempfile.TemporaryDirectory() as tmp:
        sk.save(tmp, {"model": source}, step=1)
        saved = sk.read(tmp)["model"]
        for staging in (direct.STAGING_BYTES, 1 << 20, 4096):
            live = build(1)
            pairs = direct.direct_pairs(live, saved)
            if pairs is None:
                failures.append("the CUDA model did not take the direct path")
                break
            direct.copy_pairs(pairs, staging_bytes=staging)
            torch.cuda.synchronize()
            failures += [f"staging {staging}: {k}" for k in same(live, source)]
        live = build(2)
        sk.load(tmp, {"model": live})
        failures += [f"sk.load: {k}" for k in same(live, source)]
        if live.head.weight is not live.embed.weight:
            failures.append("tied weights came apart")
        reference = build(3)
        reference.load_state_dict(saved)
        failures += [f"vs load_state_dict: {k}" for k in same(live, reference)]
        timings: dict[str, list[float]] = {"statekeeper copy": [], "load_state_dict": []}
        for _ in range(5):
            for name in timings:
                torch.cuda.synchronize()
                start = time.perf_counter()
                if name == "load_state_dict":
                    reference.load_state_dict(saved)
                else:
                    direct.copy_pairs(direct.direct_pairs(live, saved) or [])
                torch.cuda.synchronize()
                timings[name].append(time.perf_counter() - start)
    nbytes = sum(t.numel() * t.element_size() for t in saved.values())
    for name, times in timings.items():
        best = min(times)
        print(f"{name:18s} {best * 1e3:8.1f} ms  {nbytes / best / 1e9:6.2f} GB/s (best of 5)")
    if failures:
        print("FAIL:", *failures[:20], sep="\n  ")
        return 1
    print("PASS: CUDA loads through pinned staging equal the saved values and load_state_dict")
    return 0


if __name__ == "__main__":
    sys.exit(main())
