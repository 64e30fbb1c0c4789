"""Pre-emption: a watched signal makes the next step boundary save, and the run resumed from
that step ends bitwise identical to one that was never interrupted."""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from tests.helpers import launcher, preempt_ranks

import statekeeper as sk

ROOT = Path(__file__).resolve().parents[2]
STEPS = 9
SAVED = preempt_ranks.PAUSE_AT + 1


def _final(out: str) -> str:
    return next(line.split()[1] for line in out.splitlines() if line.startswith("final "))


def _child(mode: str, run: Path, *rank: str) -> launcher.Popen:
    args = [sys.executable, "-m", "tests.helpers.preempt_ranks", mode, str(run), str(STEPS)]
    return launcher.Popen(
        [*args, *rank], cwd=ROOT, stdin=launcher.subprocess.PIPE,
        stdout=launcher.subprocess.PIPE, stderr=launcher.subprocess.PIPE, text=True,
    )  # fmt: skip


def _until_paused(proc: Any) -> None:
    """Read the child's output up to its pause (a hung child fails the test, never hangs it)."""
    found: list[bool] = []

    def read() -> None:
        for line in proc.stdout:
            if line.strip() == f"step {preempt_ranks.PAUSE_AT}":
                found.append(True)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(300)
    if not found:
        proc.kill()
        raise AssertionError(f"the run never reached step {preempt_ranks.PAUSE_AT}")


def test_a_signal_saves_at_the_next_boundary_and_the_resumed_run_is_identical(
    tmp_path: Path,
) -> None:
    reference = launcher.run(
        [sys.executable, "-m", "tests.helpers.preempt_ranks", "full", str(tmp_path / "ref"),
         str(STEPS)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    proc = _child("preempt", tmp_path / "run")
    try:
        _until_paused(proc)
        proc.send_signal(signal.SIGTERM)  # as a scheduler does
        out, err = proc.communicate("go\n", timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == sk.Checkpointer.PREEMPTED_EXIT_CODE, err[-2000:]
    assert f"preempted {SAVED}" in out
    assert [c.step for c in sk.list_checkpoints(tmp_path / "run")] == [SAVED]
    resumed = launcher.run(
        [sys.executable, "-m", "tests.helpers.preempt_ranks", "resume", str(tmp_path / "run"),
         str(STEPS)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert _final(resumed.stdout) == _final(reference.stdout)


@pytest.mark.xdist_group("gloo")
def test_a_signal_to_one_rank_saves_the_same_step_on_every_rank(tmp_path: Path) -> None:
    def job(mode: str, run: Path) -> list[Any]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return [_child(mode, run, str(r), "2", str(port)) for r in range(2)]

    def finish(procs: list[Any], go: bool = False) -> list[str]:
        try:
            for p in procs:  # every rank goes on before any is waited for (they talk)
                if go:
                    p.stdin.write("go\n")
                p.stdin.close()
            outs = [(p.stdout.read(), p.stderr.read()) for p in procs]
            for p in procs:
                p.wait(timeout=300)
        finally:
            for p in procs:
                p.kill()
        for p, (_, err) in zip(procs, outs, strict=True):
            assert p.returncode in (0, sk.Checkpointer.PREEMPTED_EXIT_CODE), err[-2000:]
        return [out for out, _ in outs]

    reference = finish(job("full", tmp_path / "ref"))
    procs = job("preempt", tmp_path / "run")
    for p in procs:
        _until_paused(p)
    procs[1].send_signal(signal.SIGTERM)  # one rank only
    outs = finish(procs, go=True)
    assert [p.returncode for p in procs] == [sk.Checkpointer.PREEMPTED_EXIT_CODE] * 2
    assert all(f"preempted {SAVED}" in out for out in outs)
    assert [c.step for c in sk.list_checkpoints(tmp_path / "run")] == [SAVED]
    resumed = finish(job("resume", tmp_path / "run"))
    assert [_final(o) for o in resumed] == [_final(o) for o in reference]


def test_in_one_process_the_save_is_synchronous_and_handlers_come_back(tmp_path: Path) -> None:
    seen: list[int] = []
    saved_when_chained: list[list[int]] = []

    def earlier(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        saved_when_chained.append([c.step for c in sk.list_checkpoints(tmp_path)])

    before = signal.signal(signal.SIGUSR1, earlier)
    try:
        every = sk.EverySteps(2) | sk.OnSignal("sigusr1")
        with sk.Checkpointer(tmp_path, every=every, blocking=False) as ckpt:
            x = torch.zeros(3)
            assert ckpt.maybe_save(1, {"x": x}) is None and not ckpt.preempted
            pending = ckpt.maybe_save(2, {"x": x})  # a background save in flight...
            os.kill(os.getpid(), signal.SIGUSR1)
            assert seen == []  # the earlier handler waits for the save
            info = ckpt.maybe_save(3, {"x": x})
            assert isinstance(info, sk.CheckpointInfo) and info.step == 3  # committed now
            assert pending is not None and pending.done()  # ... was waited for first
            assert ckpt.preempted and seen == [signal.SIGUSR1]
            assert saved_when_chained == [[2, 3]]  # chained once step 3 was safe
            assert ckpt.maybe_save(5, {"x": x}) is None  # one save per signal
        assert signal.getsignal(signal.SIGUSR1) is earlier  # put back by close()
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert [c.step for c in sk.list_checkpoints(tmp_path)] == [2, 3]


def test_a_handler_that_raises_runs_after_the_save(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path, every=sk.OnSignal(signal.SIGINT)) as ckpt:
        os.kill(os.getpid(), signal.SIGINT)  # Python's own handler raises KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            ckpt.maybe_save(7, {"x": 1})
        assert ckpt.preempted
    assert [c.step for c in sk.list_checkpoints(tmp_path)] == [7]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_closing_in_any_order_or_never_leaves_signals_working(tmp_path: Path) -> None:
    seen: list[int] = []
    before = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    try:
        a = sk.Checkpointer(tmp_path / "a", every=sk.OnSignal(signal.SIGUSR2))
        b = sk.Checkpointer(tmp_path / "b", every=sk.OnSignal(signal.SIGUSR2))
        a.close()  # not the reverse order: b's handler stays, and passes signals on
        os.kill(os.getpid(), signal.SIGUSR2)
        assert b._watch is not None and b._watch.fired and seen == []
        b.close()  # the recorded signal was not served by a save: it goes on to the earlier
        assert seen == [signal.SIGUSR2]
        c = sk.Checkpointer(tmp_path / "c", every=sk.OnSignal(signal.SIGUSR2))
        del c  # never closed
        gc.collect()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert seen == [signal.SIGUSR2] * 2  # the dropped watch passes it on
    finally:
        signal.signal(signal.SIGUSR2, before)


@pytest.mark.parametrize("bad", [(), (signal.SIGKILL,), ("NOPE",), (True,)])
def test_on_signal_refuses_what_cannot_be_watched(bad: tuple[Any, ...]) -> None:
    with pytest.raises(sk.errors.InvalidArgumentError):
        sk.OnSignal(*bad)


def test_signal_handlers_need_the_main_thread(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    before = signal.getsignal(signal.SIGTERM)

    def make() -> None:
        try:
            sk.Checkpointer(tmp_path, every=sk.OnSignal(signal.SIGTERM))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join(60)
    assert len(errors) == 1 and isinstance(errors[0], sk.errors.InvalidArgumentError)
    assert "main thread" in str(errors[0])
    assert signal.getsignal(signal.SIGTERM) is before
    with sk.Checkpointer(tmp_path):  # the failed one did not keep the writer lock
        pass
