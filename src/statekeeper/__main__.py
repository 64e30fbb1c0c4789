"""``python -m statekeeper``: the ``statekeeper`` command, for environments where the
console script is not on ``PATH`` (a venv not activated, ``python -m`` in job scripts)."""

from __future__ import annotations

from statekeeper.cli.main import main

if __name__ == "__main__":
    main(prog_name="statekeeper")
