"""The writer lock belongs to a process: forked children hold nothing, exec'd ones never
see its descriptor, it stays exclusive across processes, objects and threads, and it goes
with its holder. Real forks (``os.fork``, a torch DataLoader's workers), real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from tests.helpers import launcher

import statekeeper as sk

ROOT = Path(__file__).resolve().parents[2]
TAKE_LOCK = "import sys, statekeeper as sk; print(sk.audit.remove_partial(sys.argv[1]))"


def _other_process_takes_the_lock(run: Path) -> subprocess.CompletedProcess[str]:
    return launcher.run(
        [sys.executable, "-c", TAKE_LOCK, str(run)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


@contextmanager
def _forked_child() -> Iterator[int]:
    """A child forked now that lives (blocked on a pipe) until the block ends."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only waits, then leaves without running any cleanup
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    try:
        yield pid
    finally:
        os.write(write_end, b"x")
        os.close(write_end)
        os.waitpid(pid, 0)


def test_a_child_forked_while_the_lock_is_held_does_not_pin_it(tmp_path: Path) -> None:
    ckpt = sk.Checkpointer(tmp_path)
    ckpt.save(1, {"x": 1})
    with _forked_child():
        ckpt.close()  # the child lives on, with a copy of every descriptor
        done = _other_process_takes_the_lock(tmp_path)
        assert done.returncode == 0, done.stderr  # not refused in the name of anyone
        with sk.Checkpointer(tmp_path) as again:  # and this process writes again
            again.save(2, {"x": 2})
    assert [i.step for i in sk.list_checkpoints(tmp_path)] == [1, 2]


def test_dataloader_workers_forked_during_a_background_save_hold_nothing(tmp_path: Path) -> None:
    """Persistent workers forked while a Checkpointer's background save holds the lock; the
    Checkpointer is closed and a new one saves while the workers live."""
    data = torch.utils.data.TensorDataset(torch.arange(64, dtype=torch.float32))
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
    state = {"w": torch.randn(512, 512)}
    ckpt = sk.Checkpointer(tmp_path, blocking=False)
    pending = ckpt.save(1, state)
    batches = iter(loader)  # the workers fork now, while the save holds the lock
    next(batches)
    pending.wait()
    ckpt.close()
    try:
        # (typing) the loader iterator's private worker list: whether they live is tested
        assert all(w.is_alive() for w in batches._workers)  # type: ignore[attr-defined]
        done = _other_process_takes_the_lock(tmp_path)
        assert done.returncode == 0, done.stderr
        with sk.Checkpointer(tmp_path, blocking=False) as again:
            again.save(2, state).wait()
        sk.save(tmp_path, state, step=3, blocking=False).wait()
        assert sum(1 for _ in batches) == 15  # the workers still serve the epoch
    finally:
        del batches
    assert [i.step for i in sk.list_checkpoints(tmp_path)] == [1, 2, 3]


def test_the_lock_stays_exclusive_across_processes_objects_and_threads(tmp_path: Path) -> None:
    ckpt = sk.Checkpointer(tmp_path)
    try:
        refused = _other_process_takes_the_lock(tmp_path)
        assert refused.returncode != 0
        assert "WriterConflictError" in refused.stderr
        assert f"pid {os.getpid()} on" in refused.stderr  # names the real holder
        with pytest.raises(sk.errors.WriterConflictError, match="another writer of this process"):
            sk.save(tmp_path, {"x": 1}, step=1)
        errors: list[BaseException] = []

        def second() -> None:
            try:
                sk.Checkpointer(tmp_path)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], sk.errors.WriterConflictError)
        ckpt.save(1, {"x": 1})  # the holder itself is not refused
    finally:
        ckpt.close()
    assert _other_process_takes_the_lock(tmp_path).returncode == 0


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    code = (
        "import sys, statekeeper as sk; c = sk.Checkpointer(sys.argv[1]); "
        "print('held', flush=True); sys.stdin.read()"
    )
    child = launcher.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    with pytest.raises(sk.errors.WriterConflictError, match=f"pid {child.pid} on"):
        sk.Checkpointer(tmp_path)
    child.kill()
    child.wait()
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"x": 1})


def test_a_program_the_holder_executes_never_inherits_the_lock(tmp_path: Path) -> None:
    """Even with ``close_fds=False``: the descriptor is close-on-exec."""
    with sk.Checkpointer(tmp_path):
        listing = subprocess.run(
            ["ls", "-l", "/proc/self/fd/"],
            close_fds=False,
            capture_output=True,
            text=True,
            check=True,
        )
    assert ".statekeeper.lock" not in listing.stdout


def test_closing_another_descriptor_of_the_lock_file_keeps_the_lock(tmp_path: Path) -> None:
    """A backup that copies the run directory (or any reader of the lock file) in the
    holding process opens and closes the lock file: the lock must stay held (a POSIX record
    lock would be dropped by that close and let a second writer in)."""
    import shutil

    with sk.Checkpointer(tmp_path / "run") as ckpt:
        ckpt.save(1, {"x": 1})
        shutil.copytree(tmp_path / "run", tmp_path / "backup")
        (tmp_path / "run" / ".statekeeper.lock").read_text()
        refused = _other_process_takes_the_lock(tmp_path / "run")
        assert refused.returncode != 0 and "WriterConflictError" in refused.stderr
        ckpt.save(2, {"x": 2})
    assert _other_process_takes_the_lock(tmp_path / "run").returncode == 0


def test_the_lock_excludes_a_writer_that_takes_it_with_flock(tmp_path: Path) -> None:
    """Earlier releases (and other tools) lock the file with ``flock``: both sides of an
    upgrade must exclude each other."""
    import fcntl

    code = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except BlockingIOError:\n    sys.exit(3)\n"
    )
    lock = tmp_path / ".statekeeper.lock"
    with sk.Checkpointer(tmp_path):
        done = launcher.run([sys.executable, "-c", code, str(lock)], cwd=ROOT, check=False)
        assert done.returncode == 3
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(sk.errors.WriterConflictError):
            sk.Checkpointer(tmp_path)
    finally:
        os.close(fd)


def _lock_descriptor(run: Path) -> int:
    """This process's descriptor of ``run``'s lock file (found in /proc: what a child that
    ``subprocess`` is starting holds a copy of until its exec)."""
    target = str(run / ".statekeeper.lock")
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == target:
                return int(name)
        except OSError:
            continue
    raise AssertionError("the lock file is not open")


def test_a_lock_a_starting_child_still_holds_is_taken_once_the_child_lets_go(
    tmp_path: Path,
) -> None:
    """A save released the lock while a child this process is starting (``subprocess``,
    between its fork and its exec: ``git status`` for the origin, a logger's helper) still
    holds a copy of the descriptor: the next save of this process waits for the copy to go,
    instead of failing with a WriterConflictError that names this process."""
    storage = sk.storage.LocalStorage(tmp_path)
    with storage.writer_lock():
        child = subprocess.Popen(  # holds the lock's open file until its stdin closes
            [sys.executable, "-c", "import sys; sys.stdin.read()"],
            stdin=subprocess.PIPE, pass_fds=(_lock_descriptor(tmp_path),),
        )  # fmt: skip
    taken: list[object] = []

    def save_again() -> None:
        try:
            with sk.storage.LocalStorage(tmp_path).writer_lock():
                taken.append(True)
        except sk.errors.WriterConflictError as exc:
            taken.append(exc)

    again = threading.Thread(target=save_again)
    again.start()
    assert child.stdin is not None
    child.stdin.close()  # the child ends: its copy of the descriptor goes
    child.wait(timeout=120)
    again.join(timeout=120)  # a hang guard only
    assert taken == [True]


def test_a_lock_another_process_holds_is_still_refused_at_once(tmp_path: Path) -> None:
    """The wait is only for this process's own lock: one that names another holder is a
    conflict at once, as before."""
    (tmp_path / ".statekeeper.lock").write_text("pid 1 on elsewhere\n")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); sys.stdin.read()", str(tmp_path / ".statekeeper.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with (
            pytest.raises(sk.errors.WriterConflictError, match="pid 1 on elsewhere"),
            sk.storage.LocalStorage(tmp_path).writer_lock(),
        ):
            pass
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=120)
