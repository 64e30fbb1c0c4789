"""A SIGTERM that comes again after the pre-emption save (launchers repeat it; ``close()`` may
wait for uploads) never changes the documented exit code: the job that saved is requeued."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import launcher

import statekeeper as sk

ROOT = Path(__file__).resolve().parents[2]


def _line(proc: Any, prefix: str) -> str:
    """The child's next output line starting with ``prefix`` (a hung child fails the test)."""
    found: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith(prefix):
                found.append(line.strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(120)
    if not found:
        proc.kill()
        raise AssertionError(f"the child never printed {prefix!r}")
    return found[0]


@pytest.mark.parametrize(
    "when",
    [("after_save",), ("during_close",), ("after_close",), ("after_save", "during_close")],
    ids="+".join,
)
def test_a_repeated_sigterm_keeps_the_preempted_exit_code(
    tmp_path: Path, when: tuple[str, ...]
) -> None:
    run, mirror = tmp_path / "run", tmp_path / "mirror"
    proc = launcher.Popen(
        [sys.executable, "-m", "tests.helpers.preempt_repeat", str(run), str(mirror), *when],
        cwd=ROOT, stdin=launcher.subprocess.PIPE, stdout=launcher.subprocess.PIPE,
        stderr=launcher.subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _line(proc, "ready")
        proc.send_signal(signal.SIGTERM)  # the scheduler's pre-emption notice
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert _line(proc, "saved") == "saved 1"
        if "after_save" in when:
            proc.send_signal(signal.SIGTERM)  # the launcher sends it again
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == sk.Checkpointer.PREEMPTED_EXIT_CODE, err[-2000:]
    assert "closed" in out  # the loop ran to its exit, nothing killed it on the way
    assert [c.step for c in sk.list_checkpoints(run)] == [1]
    assert [c.step for c in sk.list_checkpoints(mirror)] == [1]  # close() finished the upload
