"""Run directories for the command-line tests, and a runner that invokes `statekeeper`.

Test modules take everything from here as fixtures (they never import this file).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

import statekeeper
from statekeeper.cli.main import main

PARTIAL = "step_000000009.partial-abc123"


class Tied(torch.nn.Module):
    """An embedding whose output head shares its weight (stored once, plus one alias)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(6, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight


def _state(seed: int) -> dict[str, object]:
    torch.manual_seed(seed)
    return {
        "model": Tied(),
        "extra": torch.zeros(3, 5, dtype=torch.bfloat16),
        "epoch": seed,
        "config": {"lr": 0.01, "name": "tiny", "ids": list(range(500))},
    }


@pytest.fixture
def invoke() -> Callable[..., Result]:
    """``invoke("ls", path, "--json")`` runs the CLI in-process, with a wide terminal."""
    runner = CliRunner(env={"COLUMNS": "240"})

    def run(*args: object) -> Result:
        return runner.invoke(main, [str(a) for a in args])

    return run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Committed steps 1 and 2 (with metrics) and one interrupted save at step 9."""
    run = tmp_path / "run"
    statekeeper.save(run, _state(1), step=1, metrics={"loss": 1.5})
    statekeeper.save(run, _state(2), step=2, metrics={"loss": 0.75, "tokens": 1200})
    partial = run / PARTIAL
    partial.mkdir()
    (partial / "tensors-00000.safetensors").write_bytes(b"half a shard")
    return run


@pytest.fixture
def step_dir() -> Callable[[Path, int], Path]:
    return lambda run, step: run / f"step_{step:09d}"


@pytest.fixture
def shard() -> Callable[[Path], Path]:
    """The only safetensors file of a step directory."""

    def find(step: Path) -> Path:
        (found,) = step.glob("*.safetensors")
        return found

    return find


@pytest.fixture
def flip_byte() -> Callable[[Path, int], None]:
    def flip(path: Path, offset: int) -> None:
        data = bytearray(path.read_bytes())
        data[offset] ^= 0xFF
        path.write_bytes(bytes(data))

    return flip
