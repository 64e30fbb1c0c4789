"""Benchmark: does holding the garbage collector off during a save or a load pay?

``statekeeper.checkpoint.gc_pause.collector_paused`` switches cyclic collection off while a
step is written or read. This script times the same saves and loads with the pause and
without it (the pause replaced by a no-op in every module that uses it), interleaved, in
the same process, for two states:

- ``many-small``: one module of ``--small`` tiny tensors (the case the pause was made
  for: tens of thousands of short-lived records per call);
- ``few-large``: ``--large`` tensors of ``--large-mib`` MiB each.

The process also holds ``--heap`` extra live objects (a training process holds torch, its
model and its data loader's objects), since a full collection's cost grows with the heap.
Printed: median seconds of each, and the ratio no-pause / pause (above 1: the pause pays).

    .venv/bin/python bench/gc_pause.py [--rounds 5] [--small 20000] [--large 4]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import statekeeper as sk  # noqa: E402
from statekeeper.checkpoint import async_save, load, save, writer  # noqa: E402

_USERS = (save, async_save, writer, load)
try:  # a job's background save uses it too (needs torch.distributed)
    from statekeeper.distributed import async_save as job_async_save

    _USERS += (job_async_save,)
except ImportError:  # pragma: no cover - torch without distributed
    pass


@contextlib.contextmanager
def _no_pause() -> Iterator[None]:
    yield


@contextlib.contextmanager
def pause_replaced(off: bool) -> Iterator[None]:
    """With ``off``, every user of ``collector_paused`` gets a no-op instead."""
    saved = [m.collector_paused for m in _USERS]  # type: ignore[attr-defined]
    try:
        if off:
            for m in _USERS:
                m.collector_paused = _no_pause  # type: ignore[attr-defined]
        yield
    finally:
        for m, f in zip(_USERS, saved, strict=True):
            m.collector_paused = f  # type: ignore[attr-defined]


def many_small(n: int) -> torch.nn.Module:
    model = torch.nn.Module()
    for i in range(n):
        model.register_buffer(f"b{i}", torch.full((4,), float(i)))
    return model


def few_large(n: int, mib: int) -> torch.nn.Module:
    model = torch.nn.Module()
    for i in range(n):
        model.register_buffer(f"w{i}", torch.randn(mib << 18))  # float32: 4 bytes each
    return model


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(name: str, model: torch.nn.Module, rounds: int, root: Path) -> None:
    state = {"model": model}
    times: dict[tuple[str, bool], list[float]] = {}
    step = 0
    for r in range(rounds + 1):  # round 0 warms up (files, page cache, plans): not counted
        for off in (False, True) if r % 2 else (True, False):  # interleaved, order alternated
            with pause_replaced(off):
                run = root / f"{name}-{off}"
                step += 1
                saved = timed(partial(sk.save, run, state, step=step, overwrite=True))
                loaded = timed(partial(sk.load, run, state))
                if r:
                    times.setdefault(("save", off), []).append(saved)
                    times.setdefault(("load", off), []).append(loaded)
    for op in ("save", "load"):
        paused = statistics.median(times[(op, False)])
        free = statistics.median(times[(op, True)])
        print(
            f"{name:10s} {op}: pause {paused * 1e3:8.1f} ms  no pause {free * 1e3:8.1f} ms  "
            f"ratio no-pause/pause {free / paused:5.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", type=int, default=20000)
    parser.add_argument("--large", type=int, default=4)
    parser.add_argument("--large-mib", type=int, default=64)
    parser.add_argument("--heap", type=int, default=200_000)
    args = parser.parse_args()
    heap = [{"i": i} for i in range(args.heap)]  # live, tracked objects, as in a training process
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bench("many-small", many_small(args.small), args.rounds, root)
        bench("few-large", few_large(args.large, args.large_mib), args.rounds, root)
    del heap


if __name__ == "__main__":
    main()
