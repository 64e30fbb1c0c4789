"""Running the user-level examples of docs/integrations.md (the Accelerate one and the
transformers one), as a user would run the script, optionally SIGKILLed right after a
given step is committed.

Usage: python -m tests.helpers.hf_examples NAME OUTPUT_DIR KILL_AT. NAME is the example's
tag in the page (the ``<!-- example: NAME -->`` line before its ``python`` block); the
script gets OUTPUT_DIR as its argument; KILL_AT (0: never) is the step whose commit is
followed by a SIGKILL of the process (deterministic: the hook is in statekeeper's commit).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def example(name: str) -> str:
    """The ``python`` block after ``<!-- example: NAME -->`` in docs/integrations.md."""
    text = PAGE.read_text()
    found = re.search(rf"<!-- example: {re.escape(name)} -->\s*```python\n(.*?)```", text, re.S)
    assert found, f"no example {name!r} in {PAGE}"
    return found.group(1)


def _kill_after(at: int) -> None:
    from statekeeper.integrations import accelerate, hf_layout

    commit, save = hf_layout.commit, accelerate.save

    def committed(built: Any, step: int) -> Any:
        done = commit(built, step)
        if step == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    def saved(run: Any, state: Any, *, step: int, **kw: Any) -> Any:
        done = save(run, state, step=step, **kw)
        if step == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    hf_layout.commit = committed  # type: ignore[assignment]
    accelerate.save = saved  # type: ignore[assignment]


def main() -> None:
    name, out, kill = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kill:
        _kill_after(kill)
    sys.argv = [f"{name}.py", out]
    exec(compile(example(name), f"docs/integrations.md:{name}", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main()
