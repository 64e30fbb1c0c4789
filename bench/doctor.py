"""How long `statekeeper doctor` takes on a ResNet-50-sized model (target: under 20 s).

Run: .venv/bin/python bench/doctor.py [--batch 2] [--size 64]
Builds the ResNet-50 layout from bench/ema.py (25.6M parameters), with an optimizer and an
example input, and runs every rule once, printing each rule's time and the total.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ema import resnet50_shaped
from statekeeper.doctor.rule import Rule
from statekeeper.doctor.rules import RULES
from statekeeper.doctor.run import run

SIZE = 64
BATCH = 2


def factory() -> dict[str, Any]:
    model = resnet50_shaped()
    return {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        "example_input": torch.randn(BATCH, 3, SIZE, SIZE),
    }


class Timed:
    """Wraps a rule to time it."""

    def __init__(self, rule: Rule, times: dict[str, float]) -> None:
        self.rule, self.times = rule, times
        self.id, self.summary = rule.id, rule.summary
        self.severity, self.needs = rule.severity, rule.needs

    def check(self, target: Any) -> Any:
        start = time.perf_counter()
        found = list(self.rule.check(target))
        self.times[self.id] = time.perf_counter() - start
        return found


def main() -> int:
    global SIZE, BATCH
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=SIZE)
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args()
    SIZE, BATCH = args.size, args.batch
    torch.set_num_threads(2)
    times: dict[str, float] = {}
    start = time.perf_counter()
    report = run(factory, rules=tuple(Timed(r, times) for r in RULES), spec="bench.doctor:factory")
    total = time.perf_counter() - start
    params = sum(p.numel() for p in resnet50_shaped().parameters())
    print(f"statekeeper doctor on a ResNet-50-shaped model: {params:,} parameters, "
          f"input {BATCH}x3x{SIZE}x{SIZE}, torch {torch.__version__}, 2 threads")  # fmt: skip
    for rule_id, seconds in times.items():
        print(f"  {rule_id}  {seconds:7.2f} s")
    for rule_id, reason in report.skipped:
        print(f"  {rule_id}  skipped: {reason}")
    print(f"total {total:.2f} s (target < 20 s), {len(report.findings)} finding(s), "
          f"exit code {report.exit_code}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
