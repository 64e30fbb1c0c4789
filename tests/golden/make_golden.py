"""Generate the format-version-1 golden checkpoint: ``python tests/golden/make_golden.py``.

The state below holds every kind of value the format can store. Everything is built from
exact constants (no random numbers), and ``created`` and ``library`` are pinned, so the
output is the same bytes on every machine. ``tests/format/test_golden.py`` regenerates it
into a temporary directory and compares it byte for byte with the committed files, which
pin format version 1 forever: never regenerate them to make a test pass, add ``v2`` instead.
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from statekeeper.catalog.naming import step_entry
from statekeeper.checkpoint.writer import write_step
from statekeeper.storage.local import LocalStorage

GOLDEN_ROOT = Path(__file__).resolve().parent / "v1"
STEP = 7
CREATED = "2026-01-01T00:00:00.000000Z"
LIBRARY = {"statekeeper": "golden", "torch": "golden"}
METRICS: dict[str, float | int] = {"loss": 0.25, "tokens": 123456, "grad_norm": math.inf}


class GoldenNet(torch.nn.Module):
    """A small module with a tied pair (``embed.weight`` is ``head.weight``) and buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 4)
        self.proj = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.head = torch.nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight


def golden_module() -> GoldenNet:
    """A GoldenNet whose every parameter and buffer holds exact, RNG-free values."""
    net = GoldenNet()
    with torch.no_grad():
        for i, (_, t) in enumerate(net.state_dict(keep_vars=True).items()):
            if t.dtype.is_floating_point:
                ramp = torch.arange(t.numel(), dtype=torch.float32) * 0.125 - i
                t.copy_(ramp.reshape(t.shape))
            else:
                t.fill_(3)  # norm.num_batches_tracked
    return net


def build_state() -> dict[str, Any]:
    """The captured state (names to plain values and state_dicts) of the golden step."""
    view_base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    shared = torch.arange(10, dtype=torch.int64)
    return {
        "model": golden_module().state_dict(),
        "scalars": {
            "none": None,
            "true": True,
            "false": False,
            "zero": 0,
            "negative": -7,
            "huge": 2**70 + 1,
            "huge_negative": -(2**80) - 3,
            "float": 0.1,
            "inf": math.inf,
            "neg_inf": -math.inf,
            "nan": math.nan,
            "neg_zero": -0.0,
            "text": "h\u00e9llo \u2713 \u65e5\u672c \U0001f680",
            "bytes": b"\x00\x01\xfe\xffstatekeeper",
            "complex": complex(1.5, -2.25),
        },
        "containers": {
            "tuple": (1, "two", 3.0),
            "list": [1, "two", 3.0],
            "empty_tuple": (),
            "empty_list": [],
            "empty_dict": {},
            "nested": ([1, (2, [3])], {"inner": (None,)}),
            "int_keys": {1: "one", 2: "two", -3: "minus three"},
            "dollar_keys": {"$tensor": "not a reference", "plain": 2},
            "tuple_keys": {(1, "a"): "tuple key"},
        },
        "torch_values": {
            "dtype": torch.bfloat16,
            "dtypes": [torch.float32, torch.float8_e4m3fn, torch.bool],
            "size": torch.Size([2, 3]),
            "device": torch.device("cpu"),
        },
        "numpy": {
            "float32": np.float32(0.1),
            "int64": np.int64(-(2**40)),
            "bool": np.bool_(True),
            "array": np.array([[0.5, -1.25, 3.0], [1e-300, 2.0**-1074, 1e300]]),
        },
        "tensors": {
            "float32": torch.tensor([[1.0, -2.5], [math.nan, math.inf], [-math.inf, -0.0]]),
            "float16": torch.tensor([0.5, -65504.0, 6.1035e-05], dtype=torch.float16),
            "bfloat16": torch.tensor([1.0, -3.0, 2.0**100], dtype=torch.bfloat16),
            "float8_e4m3fn": torch.tensor([0.5, -448.0, 1.75], dtype=torch.float8_e4m3fn),
            "int64": torch.tensor([0, -1, 2**62, -(2**63)], dtype=torch.int64),
            "uint8": torch.tensor([0, 127, 255], dtype=torch.uint8),
            "bool": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5),
            "empty": torch.empty(0, 3),
            "expanded": torch.tensor([1.0, 2.0, 3.0]).expand(2, 3),
        },
        "views": {"base": view_base, "slice": view_base[1:, ::2]},
        "storage": {"head": shared[:3], "tail": shared[6:]},
        "same_path": {
            1: torch.tensor([1], dtype=torch.int64),
            "1": torch.tensor([2], dtype=torch.int64),
        },
    }


def write_golden(root: Path) -> Path:
    """Write the golden step under run directory ``root``; returns the step directory."""
    step_dir = root / step_entry(STEP)
    if step_dir.exists():
        shutil.rmtree(step_dir)
    write_step(
        LocalStorage(root),
        build_state(),
        step=STEP,
        metrics=METRICS,
        created=CREATED,
        library=LIBRARY,
    )
    return step_dir


def main() -> int:
    step_dir = write_golden(GOLDEN_ROOT)
    for path in sorted(step_dir.iterdir()):
        print(f"{path.stat().st_size:>8}  {path.relative_to(GOLDEN_ROOT.parent.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
