"""The forked children of tests/helpers/launcher.py behave as fresh interpreters would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import launcher

ROOT = Path(__file__).resolve().parents[2]
PROBE = r"""
import json, os, random, sys, threading
forked = "torch" in sys.modules  # imported by the server, not by this program
import numpy, torch
print(json.dumps({
    "forked": forked, "name": __name__, "argv": sys.argv, "path0": sys.path[0],
    "cwd": os.getcwd(), "hash": hash("statekeeper"), "threads": threading.active_count(),
    "torch_threads": torch.get_num_threads(), "seed": torch.initial_seed(),
    "draws": [random.random(), float(numpy.random.rand()), float(torch.rand(1))],
    "env": {k: os.environ.get(k) for k in ("SK_PROBE", "SK_ABSENT", "PYTHONHASHSEED")},
    "stdin": sys.stdin.read(),
}))
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SK_ABSENT"}
    return {**env, **extra}


def _probe(*args: str, env: dict[str, str], cwd: Path = ROOT, forked: bool = True) -> Any:
    before = len(launcher.fallbacks)
    done = launcher.run([sys.executable, "-c", PROBE, *args], env=env, cwd=cwd, input="in",
                        capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (len(launcher.fallbacks) == before) is forked, launcher.fallbacks[before:]
    out = json.loads(done.stdout)
    assert out["forked"] is forked
    return out


def test_a_forked_child_sees_its_argv_cwd_environment_stdin_and_hash_seed(tmp_path: Path) -> None:
    out = _probe("a", "b", env=_env(SK_PROBE="x", PYTHONHASHSEED="3"), cwd=tmp_path)
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; print(hash('statekeeper'), torch.get_num_threads())"],
        env=_env(PYTHONHASHSEED="3"), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert fresh.stdout.split() == [str(out["hash"]), str(out["torch_threads"])]
    assert out["name"] == "__main__" and out["argv"] == ["-c", "a", "b"] and out["path0"] == ""
    assert out["cwd"] == str(tmp_path)
    assert out["env"] == {"SK_PROBE": "x", "SK_ABSENT": None, "PYTHONHASHSEED": "3"}
    assert out["stdin"] == "in"
    assert out["threads"] == 1  # the server started no thread that the fork lost


def test_forked_children_draw_fresh_random_numbers() -> None:
    a, b = (_probe(env=_env(PYTHONHASHSEED="1")) for _ in range(2))
    assert a["seed"] != b["seed"]
    assert all(x != y for x, y in zip(a["draws"], b["draws"], strict=True))


def test_a_start_up_variable_that_differs_gets_a_fresh_interpreter() -> None:
    out = _probe(env=_env(PYTHONHASHSEED="1", PYTHONWARNINGS="ignore"), forked=False)
    assert out["env"]["PYTHONHASHSEED"] == "1"


def test_modules_and_scripts_run_as_main(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("import sys\nif __name__ == '__main__':\n    print(sys.argv, sys.path[0])\n")
    done = launcher.run([sys.executable, str(script), "x"], capture_output=True, text=True)
    assert done.stdout.split("] ")[0] + "]" == repr([str(script), "x"])
    assert done.stdout.strip().endswith(str(tmp_path))
    done = launcher.run([sys.executable, "-m", "tests.helpers.saver"], cwd=ROOT,
                        capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1 and done.stderr.splitlines()[-1].startswith("IndexError")
    assert "zygote" not in done.stderr  # the traceback starts where a fresh one would


@pytest.mark.parametrize(
    ("code", "status", "stderr"),
    [
        ("pass", 0, ""),
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('bye')", 1, "bye\n"),
        ("import os; os._exit(5)", 5, ""),
        ("raise ValueError('boom')", 1, "ValueError: boom\n"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, ""),
        ("import atexit; atexit.register(print, 'at exit')", 0, ""),
    ],
)
def test_exit_statuses_are_a_fresh_interpreters(code: str, status: int, stderr: str) -> None:
    done = launcher.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == status
    assert done.stderr.endswith(stderr)
    assert done.stdout == ("at exit\n" if "atexit" in code else "")


def test_threads_are_joined_before_exit() -> None:
    code = (
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('t'))).start()"
    )
    done = launcher.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "t\n")


def test_a_child_is_killed_for_real_and_timeouts_hold() -> None:
    code = "import time; print('ready', flush=True); time.sleep(600)"
    child = launcher.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    assert child.poll() is None
    os.kill(child.pid, 0)  # a real process of its own
    child.kill()
    assert child.wait() == -signal.SIGKILL
    child.stdout.close()
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.run([sys.executable, "-c", code], capture_output=True, timeout=0.5)
