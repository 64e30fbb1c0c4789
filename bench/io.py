"""Benchmark: checkpoint I/O of statekeeper against a raw bound and its peers.

For one ~1 GiB state (4 large matrices, 300 medium tensors, 3000 small vectors; float32 and
bfloat16; the parameters of one ``nn.Module``), medians over interleaved rounds of:

- durable save: ``sk.save`` vs a raw write bound (the tensors' memory written with ``writev``
  into one file, fsync of file and directory) vs ``torch.save`` vs ``safetensors.torch.
  save_file`` vs ``torch.distributed.checkpoint.save`` (each followed by the fsyncs it lacks);
- load into the live module, warm and cold (``posix_fadvise(DONTNEED)``): ``sk.load`` vs a raw
  read bound (``readinto`` of statekeeper's files into a preallocated buffer), a read+copy
  bound (that, then one fused copy into the live tensors) and a verify+copy floor (xxh3 of
  every file through ``mmap``, then one fused copy: the least work of a loader that checks
  every byte before it changes a live tensor) vs ``torch.load(mmap=True)`` /
  ``safetensors.torch.load_file`` + ``load_state_dict`` vs DCP ``load``;
- async: the caller stall of ``Checkpointer(blocking=False).save`` vs a plain copy of every
  tensor into preallocated buffers, and the time until ``wait()`` returns (committed);
- peak extra RSS of each save, one fresh subprocess per contender (``--peak NAME``).

Each is also given as a ratio to the bound measured in the same run, next to the issue's
targets. See bench/README.md.

    .venv/bin/python bench/io.py [--runs 3] [--size-mib 1024] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch
import xxhash
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import statekeeper as sk  # noqa: E402
from bench.ema import cpu_name  # noqa: E402  (one CPU-name probe for every bench)

try:
    import torch.distributed.checkpoint as dcp
except Exception as exc:  # pragma: no cover - depends on the torch build
    dcp = None
    DCP_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
else:
    DCP_IMPORT_ERROR = ""

warnings.filterwarnings("ignore", message="torch.distributed is disabled")

MIB = 1 << 20
SMALL_COUNT, SMALL_BYTES = 3000, 4096
MEDIUM_COUNT, LARGE_COUNT = 300, 4
LARGE_SHARE = 0.4  # of the bytes left after the small vectors; the medium tensors get the rest
IOV_MAX = 1024
GATHER_BYTES = 1 * MIB  # buffers this large are written alone

TARGETS = {
    "save_x_bound": 0.9,  # durable save throughput >= 0.9x the raw write bound
    "load_x_bound": 0.9,  # load throughput >= 0.9x the raw read bound
    "stall_x_memcpy": 1.3,  # async caller stall <= 1.3x a plain copy of the state
    "peak_mib": 64.0,  # sync save peak extra RSS <= 64 MiB
}


# --------------------------------------------------------------------------- the state


class State(nn.Module):
    """A module whose parameters are the given tensors (so ``load_state_dict`` works)."""

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        super().__init__()
        for name, t in tensors.items():
            self.register_parameter(name, nn.Parameter(t))


def layout(size_mib: float) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Names, shapes and dtypes of a state of about ``size_mib`` MiB."""
    spec: list[tuple[str, tuple[int, ...], torch.dtype]] = []
    small_total = SMALL_COUNT * SMALL_BYTES
    rest = max(size_mib * MIB - small_total, 0)
    large_each = rest * LARGE_SHARE / LARGE_COUNT
    medium_each = rest * (1 - LARGE_SHARE) / MEDIUM_COUNT
    for i in range(LARGE_COUNT):  # 3 float32, 1 bfloat16, 4096 wide
        dtype = torch.bfloat16 if i == LARGE_COUNT - 1 else torch.float32
        rows = max(1, round(large_each / (4096 * dtype.itemsize)))
        spec.append((f"large_{i}", (rows, 4096), dtype))
    for i in range(MEDIUM_COUNT):  # 2/3 float32, 1/3 bfloat16, 1024 wide
        dtype = torch.bfloat16 if i % 3 == 2 else torch.float32
        rows = max(1, round(medium_each / (1024 * dtype.itemsize)))
        spec.append((f"medium_{i:03d}", (rows, 1024), dtype))
    for i in range(SMALL_COUNT):  # 4 KiB each: 1024 float32 or 2048 bfloat16
        dtype = torch.bfloat16 if i % 3 == 2 else torch.float32
        spec.append((f"small_{i:04d}", (SMALL_BYTES // dtype.itemsize,), dtype))
    return spec


def build_model(size_mib: float, device: str = "cpu", seed: int = 0) -> State:
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {
        name: torch.randn(shape, dtype=dtype, device=device, generator=gen)
        for name, shape, dtype in layout(size_mib)
    }
    return State(tensors)


def tensors_of(model: nn.Module) -> list[Tensor]:
    return [t.detach() for t in model.state_dict().values()]


def nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def byte_view(t: Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- file helpers


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def writev_all(fd: int, views: list[memoryview]) -> None:
    """Write every buffer from its own memory: one ``write`` per large buffer, runs of small
    ones gathered into ``writev`` calls (at most IOV_MAX buffers, about GATHER_BYTES)."""
    start = 0
    while start < len(views):
        batch, size = [views[start]], len(views[start])
        start += 1
        while (
            start < len(views)
            and len(batch) < IOV_MAX
            and size < GATHER_BYTES
            and len(views[start]) < GATHER_BYTES
            and len(batch[0]) < GATHER_BYTES
        ):
            batch.append(views[start])
            size += len(views[start])
            start += 1
        while batch:
            n = os.writev(fd, batch)
            while batch and n >= len(batch[0]):
                n -= len(batch[0])
                batch.pop(0)
            if batch and n:
                batch[0] = batch[0][n:]


def readinto_all(path: Path, view: memoryview) -> int:
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < len(view):
            got = f.readinto(view[done:])
            if not got:
                break
            done += got
    return done


def files_under(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".stat"))


def total_size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def drop_cache(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def prefetch(paths: list[Path], scratch: memoryview) -> None:
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(scratch):
                pass


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_fraction(paths: list[Path]) -> float | None:
    """Share of the files' pages in the page cache (``mincore``), or None if unknown."""
    page = mmap.PAGESIZE
    resident = pages = 0
    try:
        for p in paths:
            size = p.stat().st_size
            if size == 0:
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
                if addr is None or addr == ctypes.c_void_p(-1).value:
                    return None
                n = -(-size // page)
                vec = (ctypes.c_ubyte * n)()
                rc = _libc.mincore(addr, size, vec)
                _libc.munmap(addr, size)
                if rc != 0:
                    return None
                resident += int((np.frombuffer(vec, dtype=np.uint8) & 1).sum())
                pages += n
            finally:
                os.close(fd)
    except (OSError, AttributeError):
        return None
    return resident / pages if pages else None


def settle() -> None:
    """``sync``: what earlier saves and deletions left to the file system (journal commits,
    discards of deleted blocks) is done now, not inside the next timed save."""
    os.sync()


def mount_of(path: Path) -> str:
    best, desc = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype, opts = line.split()[:4]
                if str(path).startswith(mnt) and len(mnt) > len(best):
                    best, desc = mnt, f"{dev} {fstype} ({opts}) mounted on {mnt}"
    except OSError:
        pass
    return desc


def mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return None


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


# --------------------------------------------------------------------------- contenders


@dataclass
class Ctx:
    """The live state and the buffers the bounds use (allocated once, outside timing)."""

    model: State
    device: str
    tensors: list[Tensor] = field(default_factory=list)
    nbytes: int = 0
    staging: Tensor | None = None  # CUDA: pinned host buffer for the raw bounds
    write_views: list[memoryview] = field(default_factory=list)
    read_buf: Tensor | None = None
    device_buf: Tensor | None = None
    copy_dst: list[Tensor] = field(default_factory=list)
    copy_pairs: tuple[list[Tensor], list[Tensor]] = field(default_factory=lambda: ([], []))
    pinned_dst: list[Tensor] = field(default_factory=list)
    # verify+copy floor: per shard file, (live tensor's bytes, begin, end) in the file
    floor_plan: list[tuple[Path, list[tuple[Tensor, int, int]]]] = field(default_factory=list)

    @classmethod
    def of(cls, model: State, device: str) -> Ctx:
        ctx = cls(model, device)
        ctx.tensors = tensors_of(model)
        ctx.nbytes = sum(nbytes(t) for t in ctx.tensors)
        return ctx

    def prepare_write_bound(self) -> None:
        """CPU: views of the tensors' memory; CUDA: a pinned host buffer to copy them into."""
        if self.device == "cuda":
            self.staging = torch.empty(max(self.nbytes, 1), dtype=torch.uint8, pin_memory=True)
            self.write_views = [byte_view(self.staging[: self.nbytes])]
        else:
            self.write_views = [byte_view(t) for t in self.tensors if t.numel()]

    def release_write_bound(self) -> None:
        self.staging, self.write_views = None, []


def save_bound(ctx: Ctx, d: Path, step: int) -> None:
    if ctx.staging is not None:  # CUDA: the device-to-host copy into pinned memory first
        offset = 0
        for t in ctx.tensors:
            n = nbytes(t)
            dst = ctx.staging[offset : offset + n].view(t.dtype).view(t.shape)
            dst.copy_(t, non_blocking=True)
            offset += n
        torch.cuda.synchronize()
    fd = os.open(d / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        writev_all(fd, list(ctx.write_views))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(d)


def save_sk(ctx: Ctx, d: Path, step: int) -> None:
    sk.save(d / "run", {"model": ctx.model}, step=step)


def save_torch(ctx: Ctx, d: Path, step: int) -> None:
    with open(d / "model.pt", "wb") as f:
        torch.save(ctx.model.state_dict(), f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(d)


def save_safetensors(ctx: Ctx, d: Path, step: int) -> None:
    path = d / "model.safetensors"
    safetensors.torch.save_file(ctx.model.state_dict(), str(path))
    fsync_file(path)
    fsync_dir(d)


def save_dcp(ctx: Ctx, d: Path, step: int) -> None:
    if dcp is None:
        raise RuntimeError(f"torch.distributed.checkpoint does not import: {DCP_IMPORT_ERROR}")
    dcp.save(ctx.model.state_dict(), checkpoint_id=str(d / "dcp"))  # fsyncs its files
    fsync_dir(d / "dcp")
    fsync_dir(d)


def save_sk_async(ctx: Ctx, d: Path, step: int) -> None:
    sk.save(d / "run", {"model": ctx.model}, step=step, blocking=False).wait()


SAVES: dict[str, Callable[[Ctx, Path, int], None]] = {
    "raw write bound": save_bound,
    "statekeeper": save_sk,
    "torch.save": save_torch,
    "safetensors": save_safetensors,
    "DCP": save_dcp,
}
PEAKS: dict[str, Callable[[Ctx, Path, int], None]] = {
    **SAVES,
    "statekeeper async": save_sk_async,
}

# where each contender's checkpoint lies inside its directory (the bounds read statekeeper's)
SOURCE = {
    "raw read bound": ("statekeeper", "run"),
    "read+copy bound": ("statekeeper", "run"),
    "verify+copy floor": ("statekeeper", "run"),
    "statekeeper": ("statekeeper", "run"),
    "torch.load": ("torch.save", "model.pt"),
    "safetensors": ("safetensors", "model.safetensors"),
    "DCP": ("DCP", "dcp"),
}


def alloc_read_buf(ctx: Ctx, paths: list[Path]) -> None:
    """The raw read bound's buffer (page-faulted now; pinned, with a device twin, on CUDA)."""
    ctx.read_buf = torch.zeros(max(total_size(paths), 1), dtype=torch.uint8)
    if ctx.device == "cuda":
        ctx.read_buf = ctx.read_buf.pin_memory()
        ctx.device_buf = torch.empty(ctx.read_buf.numel(), dtype=torch.uint8, device="cuda")


def load_bound(ctx: Ctx, src: Path) -> None:
    assert ctx.read_buf is not None
    view = byte_view(ctx.read_buf)
    offset = 0
    for p in files_under(src):
        offset += readinto_all(p, view[offset:])
    if ctx.device_buf is not None:  # CUDA: the host-to-device copy too
        ctx.device_buf[:offset].copy_(ctx.read_buf[:offset], non_blocking=True)
        torch.cuda.synchronize()


def _shard_header(p: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header and the offset of its data section."""
    with open(p, "rb") as f:
        (n,) = np.frombuffer(f.read(8), dtype="<u8")
        return json.loads(f.read(int(n))), 8 + int(n)


def plan_verify_copy(ctx: Ctx, src: Path) -> None:
    """Where each live tensor's bytes lie in each of statekeeper's shard files (untimed)."""
    live = {f"model/{k}": t for k, t in ctx.model.state_dict().items()}
    ctx.floor_plan = []
    for p in files_under(src):
        if p.suffix == ".safetensors":
            header, start = _shard_header(p)
            spans = [
                (live[name].view(-1).view(torch.uint8), start + b, start + e)
                for name, info in header.items()
                if name in live and live[name].numel()
                for b, e in [info["data_offsets"]]
            ]
            ctx.floor_plan.append((p, spans))


def load_verify_copy(ctx: Ctx, src: Path) -> None:
    """The least work of any loader that verifies every byte before it changes a live tensor
    (statekeeper's promise): hash each file through a memory map (xxh3-128, as statekeeper),
    then one fused copy of every value from the maps into the live tensors. No manifest, no
    header parsing, no checks, no thread: only the memory traffic that promise costs."""
    maps = []
    for p, spans in ctx.floor_plan:
        with open(p, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        xxhash.xxh3_128_hexdigest(mm)
        maps.append((torch.frombuffer(mm, dtype=torch.uint8), spans))
    dsts = [dst for _, spans in maps for dst, _, _ in spans]
    srcs = [base[b:e] for base, spans in maps for _, b, e in spans]
    with torch.no_grad():
        torch._foreach_copy_(dsts, srcs)


def plan_read_copy(ctx: Ctx, src: Path) -> None:
    """Where each live tensor's bytes lie in the read buffer once ``load_bound`` has read
    statekeeper's files into it (from the safetensors headers; untimed)."""
    assert ctx.read_buf is not None
    live = {f"model/{k}": t for k, t in ctx.model.state_dict().items()}
    ctx.copy_pairs = ([], [])
    offset = 0
    for p in files_under(src):
        size = p.stat().st_size
        if p.suffix == ".safetensors":
            header, data_start = _shard_header(p)
            start = offset + data_start
            for name, info in header.items():
                if name in live and live[name].numel():
                    begin, end = info["data_offsets"]
                    ctx.copy_pairs[0].append(live[name].view(-1).view(torch.uint8))
                    ctx.copy_pairs[1].append(ctx.read_buf[start + begin : start + end])
        offset += size


def load_read_copy(ctx: Ctx, src: Path) -> None:
    """The raw read bound plus one fused copy of every tensor's bytes from the read buffer
    into the live module's tensors: what any loader into a live model has to do at least,
    without checking anything (no checksum, no parsing, no load_state_dict)."""
    assert ctx.read_buf is not None
    view = byte_view(ctx.read_buf)
    offset = 0
    for p in files_under(src):
        offset += readinto_all(p, view[offset:])
    dsts, srcs = ctx.copy_pairs
    with torch.no_grad():
        torch._foreach_copy_(dsts, srcs, non_blocking=ctx.device == "cuda")
    sync(ctx.device)


def load_sk(ctx: Ctx, src: Path) -> None:
    sk.load(src, {"model": ctx.model})


def load_torch(ctx: Ctx, src: Path) -> None:
    sd = torch.load(src, weights_only=True, mmap=True, map_location="cpu")
    ctx.model.load_state_dict(sd)


def load_safetensors(ctx: Ctx, src: Path) -> None:
    ctx.model.load_state_dict(safetensors.torch.load_file(str(src)))


def load_dcp(ctx: Ctx, src: Path) -> None:
    if dcp is None:
        raise RuntimeError(f"torch.distributed.checkpoint does not import: {DCP_IMPORT_ERROR}")
    dcp.load(ctx.model.state_dict(), checkpoint_id=str(src))  # in place


LOADS: dict[str, Callable[[Ctx, Path], None]] = {
    "raw read bound": load_bound,
    "read+copy bound": load_read_copy,
    "verify+copy floor": load_verify_copy,
    "statekeeper": load_sk,
    "torch.load": load_torch,
    "safetensors": load_safetensors,
    "DCP": load_dcp,
}


def copy_state(ctx: Ctx) -> None:
    for src, dst in zip(ctx.tensors, ctx.copy_dst, strict=True):
        dst.copy_(src)


def copy_pinned(ctx: Ctx) -> None:
    for src, dst in zip(ctx.tensors, ctx.pinned_dst, strict=True):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()


# --------------------------------------------------------------------------- measuring


def timed(fn: Callable[[], object], device: str) -> float:
    gc.collect()
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def rotate(names: list[str], i: int) -> list[str]:
    k = i % len(names)
    return names[k:] + names[:k]


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass
class Series:
    times: list[float] = field(default_factory=list)
    error: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    def to_json(self) -> dict[str, Any]:
        return {
            "times_s": self.times,
            "median_s": self.median,
            "min_s": min(self.times) if self.times else None,
            "error": self.error or None,
            "notes": self.notes,
        }


def bench_saves(ctx: Ctx, tmp: Path, runs: int) -> tuple[dict[str, Series], dict[str, Path]]:
    """Durable saves, round-robin, each deleted after it is timed; then one untimed save per
    contender, kept as the load sources. (On this VM a save that follows a kept 1 GiB save
    measured ~1.5x slower than one following a deleted one, even after ``sync``: keeping the
    last round's outputs would penalise whoever comes next.)"""
    results = {name: Series() for name in SAVES}
    ctx.prepare_write_bound()
    for i in range(runs):
        for name in rotate(list(SAVES), i):
            series = results[name]
            if series.error:
                continue
            d = Path(tempfile.mkdtemp(prefix="save-", dir=tmp))
            settle()
            try:
                series.times.append(timed(lambda f=SAVES[name], d=d, i=i: f(ctx, d, i), ctx.device))
            except Exception as exc:
                series.error = short_error(exc)
            shutil.rmtree(d, ignore_errors=True)
    ctx.release_write_bound()
    kept: dict[str, Path] = {}
    for name, series in results.items():
        if name != "raw write bound" and not series.error:
            d = Path(tempfile.mkdtemp(prefix="source-", dir=tmp))
            try:
                SAVES[name](ctx, d, runs)
            except Exception as exc:
                series.error = f"saving the load source failed: {short_error(exc)}"
                shutil.rmtree(d, ignore_errors=True)
                continue
            kept[name] = d
    settle()
    return results, kept


def perturb(model: State, names: list[str]) -> None:
    with torch.no_grad():
        for n in names:
            getattr(model, n).view(-1)[0] = 12345.0


def restored(model: State, reference: dict[str, Tensor]) -> bool:
    return all(torch.equal(getattr(model, n).view(-1)[:1], v) for n, v in reference.items())


def bench_loads(
    ctx: Ctx, kept: dict[str, Path], runs: int
) -> tuple[dict[str, dict[str, Series]], dict[str, Any]]:
    """Loads into the live module, warm and cold, round-robin within each round."""
    modes = ["warm", "cold (fadvise)"]
    results = {m: {name: Series() for name in LOADS} for m in modes}
    sources: dict[str, Path] = {}
    for name, (saver, inner) in SOURCE.items():
        if saver in kept:
            sources[name] = kept[saver] / inner
        else:
            for m in modes:
                results[m][name].error = f"no checkpoint to load ({saver} save failed)"
    info: dict[str, Any] = {"fadvise": "ok", "resident": {m: [] for m in modes}}
    if "raw read bound" in sources:
        alloc_read_buf(ctx, files_under(sources["raw read bound"]))
        plan_read_copy(ctx, sources["raw read bound"])
        plan_verify_copy(ctx, sources["raw read bound"])
    if ctx.device != "cpu":
        for m in modes:
            results[m]["verify+copy floor"].error = "CPU only (its copy is a host-memory floor)"
    scratch = memoryview(bytearray(64 * MIB))
    check = ["large_0", f"medium_{MEDIUM_COUNT // 2:03d}", f"small_{SMALL_COUNT - 1:04d}"]
    reference = {n: getattr(ctx.model, n).detach().view(-1)[:1].clone() for n in check}
    for i in range(runs):
        for mode in modes:
            if mode != "warm" and info["fadvise"] != "ok":
                continue
            for name in rotate(list(LOADS), i):
                series = results[mode][name]
                if series.error:
                    continue
                paths = files_under(sources[name])
                if mode == "warm":
                    prefetch(paths, scratch)
                else:
                    try:
                        drop_cache(paths)
                    except (OSError, AttributeError) as exc:
                        info["fadvise"] = f"posix_fadvise failed: {short_error(exc)}"
                        break
                info["resident"][mode].append(resident_fraction(paths))
                if name != "raw read bound":
                    perturb(ctx.model, check)
                try:
                    series.times.append(
                        timed(lambda f=LOADS[name], p=sources[name]: f(ctx, p), ctx.device)
                    )
                except Exception as exc:
                    series.error = short_error(exc)
                    continue
                if name != "raw read bound" and not restored(ctx.model, reference):
                    series.error = "the live model does not hold the saved values after loading"
    ctx.read_buf = ctx.device_buf = None
    ctx.copy_pairs = ([], [])
    ctx.floor_plan = []
    return results, info


def bench_async(ctx: Ctx, tmp: Path, runs: int) -> dict[str, Series]:
    """Caller stall of an async save vs plain copies; time until committed."""
    ctx.copy_dst = [torch.empty(t.shape, dtype=t.dtype) for t in ctx.tensors]
    copy_state(ctx)  # fault the pages in
    contenders = ["memcpy", "statekeeper async"]
    if ctx.device == "cuda":
        ctx.pinned_dst = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in ctx.tensors]
        copy_pinned(ctx)
        contenders.insert(1, "pinned D2H copy")
    results = {name: Series() for name in [*contenders, "statekeeper commit"]}
    run_dir = Path(tempfile.mkdtemp(prefix="async-", dir=tmp)) / "run"

    def clear() -> None:
        for entry in run_dir.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
        settle()

    # a training loop's async saves: one Checkpointer, whose writer keeps its staging buffer
    # (a one-off sk.save(blocking=False) frees it once written). One untimed save first: the
    # staging buffer is allocated once, then reused.
    ckpt = sk.Checkpointer(run_dir, blocking=False)
    try:
        ckpt.save(0, {"model": ctx.model})
        ckpt.wait()
        clear()
    except Exception as exc:
        results["statekeeper async"].error = short_error(exc)
    for i in range(runs):
        for name in rotate(contenders, i):
            series = results[name]
            if series.error:
                continue
            if name == "memcpy":
                series.times.append(timed(lambda: copy_state(ctx), ctx.device))
            elif name == "pinned D2H copy":
                series.times.append(timed(lambda: copy_pinned(ctx), ctx.device))
            else:
                try:
                    gc.collect()
                    sync(ctx.device)
                    start = time.perf_counter()
                    pending = ckpt.save(i + 1, {"model": ctx.model})
                    stalled = time.perf_counter() - start
                    pending.wait()
                    committed = time.perf_counter() - start
                except Exception as exc:
                    series.error = short_error(exc)
                    continue
                series.times.append(stalled)
                results["statekeeper commit"].times.append(committed)
                clear()
    ckpt.close()
    ctx.copy_dst, ctx.pinned_dst = [], []
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    return results


def status_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise KeyError(field_name)


def peak_child(name: str, size_mib: float, device: str, tmp: Path) -> dict[str, Any]:
    """In a fresh process: the extra peak RSS of one save of the state."""
    save = PEAKS[name]
    warm = Ctx.of(build_model(1, device), device)  # imports and first-call set-up, not counted
    warm.prepare_write_bound()
    d = Path(tempfile.mkdtemp(prefix="peak-warm-", dir=tmp))
    save(warm, d, 0)
    shutil.rmtree(d, ignore_errors=True)
    del warm
    ctx = Ctx.of(build_model(size_mib, device), device)
    if name == "raw write bound":
        ctx.prepare_write_bound()  # its preallocated buffer (CUDA) is not part of the save
    d = Path(tempfile.mkdtemp(prefix="peak-", dir=tmp))
    gc.collect()
    method = "clear_refs"
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        method = "VmRSS before (VmHWM could not be reset)"
    before = status_kib("VmRSS")
    start = time.perf_counter()
    save(ctx, d, 1)
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    shutil.rmtree(d, ignore_errors=True)
    return {
        "contender": name,
        "rss_before_mib": before / 1024,
        "hwm_mib": peak / 1024,
        "extra_mib": (peak - before) / 1024,
        "seconds": seconds,
        "method": method,
    }


def bench_peaks(size_mib: float, device: str, tmp: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in PEAKS:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--peak", name]
        cmd += ["--size-mib", str(size_mib), "--device", device, "--tmp", str(tmp)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            out[name] = {"error": "timed out after 600 s"}
            continue
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            out[name] = {"error": f"exit code {proc.returncode}: {tail}"}
            continue
        out[name] = json.loads(lines[-1])
        settle()
    return out


# --------------------------------------------------------------------------- reporting


def fmt(x: float | None, spec: str, missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def table(headers: list[str], rows: list[list[str]]) -> None:
    if not rows:
        print("  (not measured)")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(
        h.ljust(w) if i == 0 else h.rjust(w)
        for i, (h, w) in enumerate(zip(headers, widths, strict=True))
    )
    print(("  " + line).rstrip())
    print("  " + "-" * len(line.rstrip()))
    for r in rows:
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        print(("  " + "  ".join(cells)).rstrip())


def throughput_rows(results: dict[str, Series], bound: str, nbytes: int) -> list[list[str]]:
    ref = results[bound].median
    rows = []
    for name, s in results.items():
        med = s.median
        if med is None:
            rows.append([name, "-", "-", "-", "-", f"failed: {s.error}" if s.error else ""])
            continue
        ratio = ref / med if ref else None
        note = f"failed later: {s.error}" if s.error else ""
        rows.append(
            [
                name,
                f"{med:.3f}",
                f"{min(s.times):.3f}",
                f"{nbytes / med / 1e9:.2f}",
                fmt(ratio, ".2f"),
                note,
            ]
        )
    return rows


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def report(meta: dict[str, Any], data: dict[str, Any]) -> list[list[str]]:
    nb = meta["state_bytes"]
    saves, loads, asyncs, peaks = data["save"], data["load"], data["async"], data["peak"]
    head = ["contender", "median s", "min s", "GB/s", "x bound", ""]
    print("\nDurable save (fresh directory per save, fsync of files and directory included)")
    print("  x bound = raw-write-bound time / contender time (throughput ratio, higher is better)")
    table(head, throughput_rows(saves, "raw write bound", nb))
    for mode, results in loads.items():
        resident = [r for r in data["load_info"]["resident"].get(mode, []) if r is not None]
        where = (
            f"page cache before each timed load: {min(resident):.0%}-{max(resident):.0%} "
            "of the files resident (mincore)"
            if resident
            else "residency unknown"
        )
        print(f"\nLoad into the live module, {mode}: {where}")
        table(head, throughput_rows(results, "raw read bound", nb))
    if data["load_info"]["fadvise"] != "ok":
        print(f"\n  cold (fadvise) not measured: {data['load_info']['fadvise']}")
    print("\nAsync save: caller stall (until Checkpointer(blocking=False).save returns) and commit")
    base = asyncs["memcpy"].median
    rows = []
    for name, s in asyncs.items():
        med = s.median
        if med is None:
            rows.append([name, "-", "-", "-", f"failed: {s.error}" if s.error else ""])
            continue
        label = "commit s" if name == "statekeeper commit" else "stall s"
        ratio = fmt(med / base if base else None, ".2f")
        rows.append([name, f"{med:.3f}", f"{min(s.times):.3f}", ratio, label])
    table(["contender", "median s", "min s", "x memcpy", "what"], rows)
    commit = asyncs["statekeeper commit"].median
    bound_save = saves["raw write bound"].median
    if commit and bound_save:
        print(
            f"  commit (from the call until wait() returns): {nb / commit / 1e9:.2f} GB/s, "
            f"{bound_save / commit:.2f}x the raw write bound"
        )
    print("\nPeak extra RSS of one save (fresh subprocess each; VmHWM after minus VmRSS before)")
    rows = []
    for name, p in peaks.items():
        if "error" in p:
            rows.append([name, "-", "-", "-", f"failed: {p['error']}"])
        else:
            rows.append(
                [
                    name,
                    f"{p['extra_mib']:.1f}",
                    f"{p['rss_before_mib']:.0f}",
                    f"{p['seconds']:.2f}",
                    p["method"],
                ]
            )
    table(["contender", "extra MiB", "RSS before MiB", "save s", "method"], rows)

    def ratio(results: dict[str, Series], bound: str, name: str) -> float | None:
        b, c = results[bound].median, results[name].median
        return b / c if b and c else None

    targets: list[list[str]] = []
    r = ratio(saves, "raw write bound", "statekeeper")
    targets.append(
        [
            "durable save >= 0.90x raw write bound",
            fmt(r, ".2f") + "x",
            verdict(None if r is None else r >= TARGETS["save_x_bound"]),
        ]
    )
    sk_save = saves["statekeeper"].median
    for peer in ("torch.save", "safetensors", "DCP"):
        p = saves[peer].median
        measured = f"{fmt(sk_save, '.2f')} s vs {fmt(p, '.2f')} s"
        ok = None if sk_save is None or p is None else sk_save < p
        targets.append([f"durable save faster than {peer}", measured, verdict(ok)])
    for mode, results in loads.items():
        r = ratio(results, "raw read bound", "statekeeper")
        targets.append(
            [
                f"load {mode} >= 0.90x raw read bound",
                fmt(r, ".2f") + "x",
                verdict(None if r is None else r >= TARGETS["load_x_bound"]),
            ]
        )
        for ref in ("read+copy bound", "verify+copy floor"):
            r = ratio(results, ref, "statekeeper")
            targets.append([f"load {mode} vs {ref} (no target)", fmt(r, ".2f") + "x", "n/a"])
        for peer in ("torch.load", "safetensors", "DCP"):
            sk_t, p = results["statekeeper"].median, results[peer].median
            measured = f"{fmt(sk_t, '.2f')} s vs {fmt(p, '.2f')} s"
            ok = None if sk_t is None or p is None else sk_t < p
            targets.append([f"load {mode} faster than {peer}", measured, verdict(ok)])
    stall = asyncs["statekeeper async"].median
    r = stall / base if stall and base else None
    targets.append(
        [
            "async stall <= 1.30x memcpy",
            fmt(r, ".2f") + "x",
            verdict(None if r is None else r <= TARGETS["stall_x_memcpy"]),
        ]
    )
    if "pinned D2H copy" in asyncs and asyncs["pinned D2H copy"].median and stall:
        r = stall / asyncs["pinned D2H copy"].median
        targets.append(["async stall vs pinned D2H copy (no target)", f"{r:.2f}x", "n/a"])
    extra = peaks.get("statekeeper", {}).get("extra_mib")
    targets.append(
        [
            "sync save peak extra RSS <= 64 MiB",
            fmt(extra, ".1f") + " MiB",
            verdict(None if extra is None else extra <= TARGETS["peak_mib"]),
        ]
    )
    print("\nTargets (from the issue) next to the measured values")
    table(["target", "measured", "status"], targets)
    return targets


# --------------------------------------------------------------------------- main


def warm_up(device: str, tmp: Path) -> None:
    """Every contender once on a tiny state: imports and first-call set-up, not timed."""
    ctx = Ctx.of(build_model(1, device), device)
    ctx.prepare_write_bound()
    d = Path(tempfile.mkdtemp(prefix="warmup-", dir=tmp))
    for name, save in SAVES.items():
        sub = d / name.replace(" ", "_")
        sub.mkdir()
        try:
            save(ctx, sub, 0)
        except Exception:
            continue
    kept = {name: d / name.replace(" ", "_") for name in SAVES}
    alloc_read_buf(ctx, files_under(kept["statekeeper"] / "run"))
    plan_read_copy(ctx, kept["statekeeper"] / "run")
    for name, (saver, inner) in SOURCE.items():
        try:
            LOADS[name](ctx, kept[saver] / inner)
        except Exception:
            continue
    shutil.rmtree(d, ignore_errors=True)


def metadata(args: argparse.Namespace, model: State, tmp: Path) -> dict[str, Any]:
    tensors = tensors_of(model)
    counts: dict[str, int] = {}
    for t in tensors:
        key = str(t.dtype).removeprefix("torch.")
        counts[key] = counts.get(key, 0) + 1
    meta = {
        "torch": torch.__version__,
        "statekeeper": sk.__version__,
        "safetensors": safetensors.__version__,
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "mem_total_gib": mem_total_gib(),
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "state_bytes": sum(nbytes(t) for t in tensors),
        "tensor_count": len(tensors),
        "dtype_counts": counts,
        "runs": args.runs,
        "filesystem": mount_of(tmp),
        "loadavg_start": loadavg(),
    }
    return meta


def print_header(meta: dict[str, Any]) -> None:
    print("statekeeper checkpoint I/O benchmark (bench/io.py)")
    print(
        f"  torch {meta['torch']}, statekeeper {meta['statekeeper']}, "
        f"safetensors {meta['safetensors']}, Python {meta['python']}"
    )
    print(
        f"  CPU: {meta['cpu']} ({meta['logical_cpus']} logical CPUs, "
        f"torch threads {meta['torch_threads']}, {fmt(meta['mem_total_gib'], '.0f', '?')} GiB RAM)"
        + (f"; GPU: {meta['gpu']}" if meta["gpu"] else "")
    )
    dtypes = ", ".join(f"{n} {k}" for k, n in meta["dtype_counts"].items())
    print(
        f"  state: {meta['state_bytes'] / MIB:.1f} MiB ({meta['state_bytes'] / 1e9:.3f} GB) "
        f"in {meta['tensor_count']} tensors ({LARGE_COUNT} large, {MEDIUM_COUNT} medium, "
        f"{SMALL_COUNT} x 4 KiB; {dtypes}) on {meta['device']}"
    )
    print(f"  runs: {meta['runs']} per contender, interleaved round-robin (start rotates)")
    print(f"  files: {meta['filesystem']}")
    print(f"  load average at start: {meta['loadavg_start']} (1, 5, 15 min)")


def main(argv: list[str] | None = None, *, device: str = "cpu", default_size: float = 1024) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument(
        "--size-mib",
        type=float,
        default=default_size,
        help=f"state size in MiB (default {default_size:g})",
    )
    parser.add_argument("--json", metavar="OUT", help="also write every timing to OUT")
    parser.add_argument("--skip-peak", action="store_true", help="skip the peak-RSS runs")
    parser.add_argument("--device", default=device, help=argparse.SUPPRESS)
    parser.add_argument("--peak", metavar="CONTENDER", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available here: this benchmark needs a GPU.", file=sys.stderr)
        return 1
    if args.peak:
        tmp = Path(args.tmp)
        print(json.dumps(peak_child(args.peak, args.size_mib, args.device, tmp)))
        return 0
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    bench_root = ROOT / ".bench-tmp"
    bench_root.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="io-", dir=bench_root))
    started = time.perf_counter()

    def phase(what: str) -> None:
        print(f"... {time.perf_counter() - started:5.0f} s  {what}", flush=True)

    try:
        model = build_model(args.size_mib, args.device)
        meta = metadata(args, model, tmp)
        print_header(meta)
        print()
        phase("built the state; warming up every contender on a 12 MiB state")
        warm_up(args.device, tmp)
        ctx = Ctx.of(model, args.device)
        phase("durable saves")
        saves, kept = bench_saves(ctx, tmp, args.runs)
        phase("loads")
        loads, load_info = bench_loads(ctx, kept, args.runs)
        for d in kept.values():
            shutil.rmtree(d, ignore_errors=True)
        settle()
        phase("async saves")
        asyncs = bench_async(ctx, tmp, args.runs)
        peaks: dict[str, dict[str, Any]] = {}
        if not args.skip_peak:
            phase(f"peak RSS ({len(PEAKS)} subprocesses, one per contender)")
            del ctx, model
            gc.collect()
            peaks = bench_peaks(args.size_mib, args.device, tmp)
        data = {
            "save": saves,
            "load": loads,
            "load_info": load_info,
            "async": asyncs,
            "peak": peaks,
        }
        phase("done")
        targets = report(meta, data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            bench_root.rmdir()  # only if no other run is using it
    meta["loadavg_end"] = loadavg()
    meta["total_seconds"] = time.perf_counter() - started
    print(f"\nload average at end: {meta['loadavg_end']}; total {meta['total_seconds']:.0f} s")
    if args.json:
        out = {
            "meta": meta,
            "targets": TARGETS,
            "target_rows": targets,
            "save": {k: v.to_json() for k, v in saves.items()},
            "load": {m: {k: v.to_json() for k, v in r.items()} for m, r in loads.items()},
            "load_info": load_info,
            "async": {k: v.to_json() for k, v in asyncs.items()},
            "peak": peaks,
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
