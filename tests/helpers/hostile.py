"""Building hostile run directories: resealed manifests, odd file types, and a watchdog.

A manifest's self-checksum can be recomputed by anyone, so an attacker who rewrites one can
make it pass its own check; :func:`reseal` does exactly that, so the tests exercise what
comes after that check.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import statekeeper as sk
from statekeeper.format.checksum import checksum

MANIFEST = "manifest.json"
SHARD = "tensors-00000.safetensors"
ENTRY = "step_000000001"
_KEY = '"manifest_checksum":"xxh3_128:'


def small_state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    return {"model": torch.nn.Linear(8, 8), "epoch": seed}


def saved_run(root: Path, steps: tuple[int, ...] = (1,)) -> Path:
    """A run directory with one committed step per entry of ``steps`` (one shard each)."""
    for step in steps:
        sk.save(root, small_state(step), step=step)
    return root


def reseal(text: str) -> bytes:
    """``text`` (a manifest, possibly altered) with its self-checksum recomputed."""
    at = text.rindex(_KEY) + len(_KEY)
    zeroed = text[:at] + "0" * 32 + text[at + 32 :]
    digest = checksum(zeroed.encode("ascii")).split(":", 1)[1]
    return (zeroed[:at] + digest + zeroed[at + 32 :]).encode("ascii")


def rewrite_manifest(step_dir: Path, edit: Callable[[str], str]) -> None:
    path = step_dir / MANIFEST
    path.write_bytes(reseal(edit(path.read_text())))


def set_file_record(step_dir: Path, name: str, data: bytes) -> None:
    """Write ``data`` as file ``name`` and make the manifest's record (size, checksum) match."""
    (step_dir / name).write_bytes(data)
    record = json.dumps({"size": len(data), "checksum": checksum(data)}, separators=(",", ":"))

    def edit(text: str) -> str:
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if line.startswith(f' "{name}":{{"size"'):
                lines[i] = f' "{name}":{record}' + ("," if line.endswith(",") else "")
        return "\n".join(lines)

    rewrite_manifest(step_dir, edit)


def replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def replace_with_link(path: Path, target: str | Path) -> None:
    path.unlink()
    path.symlink_to(target)


def finishes(call: Callable[[], Any], seconds: float = 120.0) -> BaseException | None:
    """Run ``call`` in a thread; the exception it raised (None if it returned).

    A call still running after ``seconds`` (a generous bound, far beyond any honest read of
    these tiny files) is reported as a hang: the verdict is the hang itself, never a speed.
    """
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"{call} hung (still blocked after {seconds:.0f} s)")
    return outcome[0]
