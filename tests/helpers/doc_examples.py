"""Running the user-level examples of docs/integrations.md (Accelerate, transformers,
Fabric, torchtitan), as a user would run the script, optionally SIGKILLed right after a
given step is committed.

Usage: python -m tests.helpers.doc_examples NAME OUTPUT_DIR KILL_AT. NAME is the example's
tag in the page (the ``<!-- example: NAME -->`` line before its ``python`` block); the
script gets OUTPUT_DIR as its argument; KILL_AT (0: never) is the step whose commit is
followed by a SIGKILL of the process (deterministic: the hook wraps the route's own save,
and the process dies as that save returns, the step committed). The hook also prints
``committed step N`` for each step saved, so that a resume that silently started again
from scratch (deterministic, hence with the same final weights) is caught. Each example
prints ``final weights <digest>`` at its end, which :func:`run_killed_and_resumed` compares.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"

# where a route commits a step: (owner, attribute, the step of a call, given its arguments)
StepOf = Callable[..., int]
KillPoint = tuple[Any, str, StepOf]


def example(name: str) -> str:
    """The ``python`` block after ``<!-- example: NAME -->`` in docs/integrations.md."""
    text = PAGE.read_text()
    found = re.search(rf"<!-- example: {re.escape(name)} -->\s*```python\n(.*?)```", text, re.S)
    assert found, f"no example {name!r} in {PAGE}"
    return found.group(1)


def _hf() -> list[KillPoint]:
    from statekeeper.integrations import accelerate, hf_layout

    return [
        (hf_layout, "commit", lambda built, step: step),
        (accelerate, "save", lambda run, state, *, step, **kw: step),
    ]


def _fabric() -> list[KillPoint]:
    from statekeeper.integrations import lightning_io

    def step(self: Any, checkpoint: Any, *args: Any, **kw: Any) -> int:
        return lightning_io.step_of(checkpoint)  # the step the plugin numbers the save by

    return [(lightning_io.StatekeeperCheckpointIO, "save_checkpoint", step)]


def _torchtitan() -> list[KillPoint]:
    from statekeeper.integrations.torchtitan import StatekeeperCheckpointManager

    # ``_save`` writes a step when the interval says so; the example saves synchronously
    return [(StatekeeperCheckpointManager, "_save", lambda self, step, *a, **kw: step)]


KILL_POINTS: dict[str, Callable[[], list[KillPoint]]] = {
    "accelerate": _hf,
    "transformers": _hf,
    "fabric": _fabric,
    "torchtitan": _torchtitan,
}


def _kill_after(name: str, at: int) -> None:
    """Print each step the route commits; SIGKILL the process once step ``at`` is."""
    for owner, attribute, step_of in KILL_POINTS[name]():
        real = getattr(owner, attribute)

        def after(*args: Any, _real: Any = real, _step_of: StepOf = step_of, **kw: Any) -> Any:
            done = _real(*args, **kw)
            if done is not False:  # False: the route saved nothing at this call
                step = _step_of(*args, **kw)
                os.write(1, f"committed step {step}\n".encode())  # unbuffered: survives a kill
                if at and step == at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return done

        setattr(owner, attribute, functools.wraps(real)(after))


def run_killed_and_resumed(where: Path, name: str, kill: int) -> None:
    """Run example NAME to its end in ``where/straight``; in ``where/killed``, SIGKILLed
    right after step ``kill`` is committed, then again (it resumes): the same final weights."""
    from tests.helpers import launcher

    def run(out: Path, at: int) -> tuple[int, str]:
        args = [sys.executable, "-m", "tests.helpers.doc_examples", name, str(out), str(at)]
        done = launcher.run(args, cwd=launcher.ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode in (0, -9), done.stderr[-3000:]
        return done.returncode, done.stdout

    def committed(out: str) -> list[int]:
        return sorted({int(n) for n in re.findall(r"^committed step (\d+)$", out, re.M)})

    code, straight = run(where / "straight", 0)
    assert code == 0 and "final weights" in straight and kill in committed(straight), straight
    code, killed = run(where / "killed", kill)
    assert code == -9 and committed(killed)[-1] == kill, (code, killed)
    code, resumed = run(where / "killed", 0)
    assert code == 0 and "final weights" in resumed, resumed
    # it went on from step ``kill``: a run started again from scratch saves the early steps
    assert committed(resumed) and min(committed(resumed)) > kill, resumed
    assert resumed.split("final weights")[1] == straight.split("final weights")[1]


def main() -> None:
    name, out, kill = sys.argv[1], sys.argv[2], int(sys.argv[3])
    _kill_after(name, kill)
    sys.argv = [f"{name}.py", out]
    exec(compile(example(name), f"docs/integrations.md:{name}", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main()
