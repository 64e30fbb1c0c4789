"""Test helpers for users of statekeeper: prove that a training run resumes exactly.

:func:`assert_resumes_exactly` runs a training run three times, each in a fresh process with
its own ``PYTHONHASHSEED``:

1. uninterrupted, ``steps`` steps;
2. with a checkpoint saved after every step, SIGKILLed right after the save of step
   ``stop_at`` (a hard stop, not a polite return);
3. resumed from the newest checkpoint of (2) by a :class:`~statekeeper.Checkpointer`, to the end.

Then every tensor and value of the final state of (1) and (3) (model, optimizer, scheduler,
RNG, data loader, ...) must be bitwise equal (``Match.BITWISE`` of
:mod:`statekeeper.state.compare`: ``-0.0`` is not ``0.0``); otherwise it fails naming the
first differing key.

``make_run`` must be a module-level function (the child processes import it by name) that
builds everything from scratch, seeds included, and returns a :class:`Run`.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statekeeper.catalog.location import locate
from statekeeper.checkpoint.reader import read_step
from statekeeper.checkpoint.save import save
from statekeeper.errors import InvalidArgumentError
from statekeeper.loop.checkpointer import RNG_ENTRY, Checkpointer
from statekeeper.loop.save_policies import EverySteps
from statekeeper.state.compare import BITWISE, state_difference
from statekeeper.state.rng import Generator, RNGState

_SYNC = "STATEKEEPER_TEST_SYNC"  # set for the ranks of a multi-process run
_BACKEND = "STATEKEEPER_TEST_BACKEND"

__all__ = [
    "Run",
    "assert_checkpoint_safe",
    "assert_resumes_exactly",
    "assert_state_equal",
    "first_difference",
]


@dataclass
class Run:
    """One training run: what is checkpointed, and how to do training step ``i`` (0-based)."""

    state: dict[str, Any]
    step: Callable[[int], None]
    generators: Mapping[str, Generator] = field(default_factory=dict)
    blocking: bool = True
    """False: save as the run's Checkpointer would with ``blocking=False``: the kill then
    comes while the last step may still be written in the background."""


def _reference(make_run: Callable[[], Run]) -> str:
    module, qualname = getattr(make_run, "__module__", None), getattr(make_run, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise InvalidArgumentError(
            f"make_run={make_run!r} must be a module-level function of an importable module, so "
            "that a fresh process can import it by name"
        )
    return f"{module}:{qualname}"


def _load_reference(ref: str) -> Callable[[], Run]:
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The key path of the first difference between two states, bitwise (``-0.0`` is not
    ``0.0``, a NaN tensor element equals one with the same bits), or None
    (:func:`statekeeper.state.compare.state_difference`).

    Mappings compare by key (in any order), lists and tuples by position.

    Args:
        a: One nested state (dicts, lists, tuples of tensors, arrays and plain values).
        b: The other.
        path: The key path of ``a`` and ``b`` themselves, prefixed to the paths reported;
            ``""`` for the root.

    Returns:
        The first difference's key path with what differs there (``"model/w: tensor values
        differ"``), or None when the states are bitwise equal.
    """
    return state_difference(a, b, path, BITWISE)


def assert_state_equal(a: Any, b: Any) -> None:
    """Assert two nested states are bitwise equal; the message names the first difference.

    Args:
        a: One nested state.
        b: The other, compared as :func:`first_difference` does.

    Raises:
        AssertionError: The states differ.
    """
    found = first_difference(a, b)
    if found:
        raise AssertionError(f"states differ at {found}")


def _die() -> None:
    """SIGKILL this process; in a multi-process run, once every rank has got here (so that no
    rank is still inside a collective with one already dead)."""
    sync = os.environ.get(_SYNC)
    if sync:
        world = int(os.environ["WORLD_SIZE"])
        Path(sync, f"rank-{os.environ['RANK']}").touch()
        while len(list(Path(sync).iterdir())) < world:
            time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)


def _child(ref: str, mode: str, run_dir: str, out_dir: str, steps: int, stop_at: int) -> None:
    if not os.environ.get(_SYNC):
        _run_child(ref, mode, run_dir, out_dir, steps, stop_at)
        return
    import torch.distributed as dist

    dist.init_process_group(os.environ.get(_BACKEND, "gloo"))
    try:
        _run_child(ref, mode, run_dir, out_dir, steps, stop_at)
    finally:  # before interpreter teardown, where gloo's threads can abort the process
        dist.destroy_process_group()


def _run_child(ref: str, mode: str, run_dir: str, out_dir: str, steps: int, stop_at: int) -> None:
    run = _load_reference(ref)()
    start = 0
    with Checkpointer(
        run_dir, every=EverySteps(1), generators=run.generators, blocking=run.blocking
    ) as ckpt:
        if mode == "resume":
            start = ckpt.restore_latest(run.state) or 0
        if mode == "stop" and stop_at == 0:
            _die()
        for i in range(start, steps):
            run.step(i)
            if mode == "stop":
                ckpt.save(i + 1, run.state)
                if i + 1 == stop_at:
                    _die()
    save(out_dir, {**run.state, RNG_ENTRY: RNGState(run.generators)}, step=steps)


@dataclass(frozen=True)
class _Exit:
    codes: list[int]
    stderr: str


def _spawn(
    args: list[str], hash_seed: int, timeout: float, world: int = 1, backend: str = "gloo"
) -> _Exit:
    """Run one phase: one process, or ``world`` ranks of a gloo job (torchrun's variables)."""
    env = {
        **os.environ,
        "PYTHONHASHSEED": str(hash_seed),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    command = [sys.executable, "-m", "statekeeper.testing", *args]
    if world == 1:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        return _Exit([done.returncode], done.stderr)
    with ExitStack() as stack:
        sync = stack.enter_context(tempfile.TemporaryDirectory())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(world)]
        ranks = [
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(world),
             "RANK": str(r), "LOCAL_RANK": str(r), _SYNC: sync, _BACKEND: backend}
            for r in range(world)
        ]  # fmt: skip
        procs = [
            subprocess.Popen(command, env={**env, **extra}, stderr=log, stdout=subprocess.DEVNULL)
            for extra, log in zip(ranks, logs, strict=True)
        ]
        try:
            codes = [p.wait(timeout) for p in procs]
        finally:
            for p in procs:
                p.kill()
        text = []
        for r, log in enumerate(logs):
            log.seek(0)
            text.append(f"--- rank {r} ---\n{log.read()[-2000:]}")
        return _Exit(codes, "\n".join(text))


def assert_resumes_exactly(
    make_run: Callable[[], Run],
    *,
    steps: int,
    stop_at: int | Sequence[int],
    workdir: str | os.PathLike[str] | None = None,
    timeout: float = 600.0,
    world_size: int = 1,
    backend: str = "gloo",
) -> None:
    """Fail unless a run killed at each ``stop_at`` and resumed ends bitwise equal to an
    uninterrupted run of ``steps`` steps (see the module docstring).

    With ``world_size`` > 1 each of the three runs is a job of that many processes on this
    machine (``torch.distributed`` initialized with ``backend`` before ``make_run``, which
    builds its sharded or DDP model itself); every rank is killed at ``stop_at``, and every
    rank's final state (its per-rank RNG and loader entries included) must match.

    Args:
        make_run: A module-level function that builds the run from scratch and returns its
            :class:`Run` (imported by name in each child process).
        steps: The number of training steps of every run (>= 1).
        stop_at: The step (or steps, each tried in turn) after whose save the run is
            killed, each from 0 (before any step) to ``steps``.
        workdir: Where to put the temporary run directories; None: the system's temporary
            directory.
        timeout: The seconds a process of each run may take.
        world_size: The number of processes of each run (>= 1).
        backend: The ``torch.distributed`` backend when ``world_size`` > 1.

    Raises:
        AssertionError: A run failed, the run to be stopped did not die by SIGKILL, or the
            resumed run ends differently from the uninterrupted one (naming the first
            differing key).
        InvalidArgumentError: ``make_run`` is not an importable module-level function, or
            ``steps``, ``stop_at`` or ``world_size`` is out of range.
        subprocess.TimeoutExpired: A process of a run took longer than ``timeout``.
    """
    ref = _reference(make_run)
    stops = [stop_at] if isinstance(stop_at, int) else list(stop_at)
    if type(world_size) is not int or world_size < 1:
        raise InvalidArgumentError(f"world_size must be an int >= 1, got {world_size!r}")
    if (
        type(steps) is not int
        or steps < 1
        or any(type(s) is not int or not 0 <= s <= steps for s in stops)
    ):
        raise InvalidArgumentError(
            f"need steps >= 1 and 0 <= stop_at <= steps, got {steps}, {stop_at}"
        )
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        root = Path(tmp)
        args = [ref, "full", str(root / "unused"), str(root / "full"), str(steps), "0"]
        full = _spawn(args, 1, timeout, world_size, backend)
        if any(full.codes):
            raise AssertionError(f"the uninterrupted run failed:\n{full.stderr[-4000:]}")
        expected = _final_states(root / "full", world_size)
        for stop in stops:
            run_dir, out = root / f"run-{stop}", root / f"resumed-{stop}"
            args = [ref, "stop", str(run_dir), str(out), str(steps), str(stop)]
            stopped = _spawn(args, 2, timeout, world_size, backend)
            if any(code != -signal.SIGKILL for code in stopped.codes):
                raise AssertionError(
                    f"the run to be stopped at step {stop} did not die by SIGKILL "
                    f"(exit {stopped.codes}):\n{stopped.stderr[-4000:]}"
                )
            args = [ref, "resume", str(run_dir), str(out), str(steps), str(stop)]
            resumed = _spawn(args, 3, timeout, world_size, backend)
            if any(resumed.codes):
                raise AssertionError(
                    f"the run resumed after step {stop} failed:\n{resumed.stderr[-4000:]}"
                )
            for rank, (want, got) in enumerate(
                zip(expected, _final_states(out, world_size), strict=True)
            ):
                found = first_difference(want, got)
                if found:
                    where = f" on rank {rank}" if world_size > 1 else ""
                    raise AssertionError(
                        f"killed after step {stop} and resumed, the run ends differently from "
                        f"the uninterrupted one{where}; first difference at {found}"
                    )


def _final_states(directory: Path, world: int) -> list[dict[str, Any]]:
    """The final state as each rank saw it (the shared state plus that rank's own)."""
    location = locate(directory, None)
    return [read_step(location, rank=r).state for r in range(world)]


def assert_checkpoint_safe(factory: Callable[[], Any], *, allow: Sequence[str] = ()) -> None:
    """Fail if ``statekeeper doctor`` finds an error or warning in what ``factory`` builds.

    ``factory`` returns a model or a dict (``model``, ``optimizer``, ``example_input``...);
    ``allow`` lists rule ids to accept (e.g. ``["SK003"]``). Info findings never fail.

    Args:
        factory: What builds the model, or the dict of what is checkpointed, to check.
        allow: Rule ids whose findings do not fail.

    Raises:
        AssertionError: The doctor found an error or warning of a rule not in ``allow``
            (the message lists them).
    """
    from statekeeper.doctor.finding import Severity  # the doctor imports this module
    from statekeeper.doctor.run import run

    report = run(factory)
    bad = [f for f in report.findings if f.severity is not Severity.INFO and f.rule not in allow]
    if bad:
        lines = "\n".join(
            f"  {f.rule} {f.severity} {f.where} {f.tensor}: {f.problem} (fix: {f.fix})" for f in bad
        )
        raise AssertionError(f"statekeeper doctor found {len(bad)} hazard(s):\n{lines}")


def _exit_rank() -> None:
    """Leave a finished rank at once: torch keeps objects that own gloo threads (device
    meshes, FSDP state) past ``destroy_process_group``, and tearing them down with the
    interpreter sometimes aborts the process ("terminate called without an active exception",
    exit 134) after all its work is done. Outputs are written and closed by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    _exit_rank()
