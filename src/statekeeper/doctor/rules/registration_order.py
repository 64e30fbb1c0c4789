"""SK002: a registration order that changes from one process to the next.

Parameters registered while iterating a ``set`` (or any hash-ordered structure of strings)
come in an order that depends on ``PYTHONHASHSEED``; an optimizer built from a set of
parameters follows memory addresses. ``torch.optim.Optimizer.state_dict()`` keys its state
by position, so a resume in another process hands each parameter another one's moments:
a crash when the shapes differ, a silent shuffle when they agree. Seen by building the
target in subprocesses with different ``PYTHONHASHSEED``s, in parallel, and comparing the
ordered names and shapes of the model's parameters and buffers and of the optimizer's
parameters.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import SPEC, DoctorRule
from statekeeper.errors import InvalidArgumentError

__all__ = ["RegistrationOrder", "describe", "main"]

SEEDS = (0, 1, 2, 3)
TIMEOUT_S = 600.0
"""How long the builds may take, wall clock, before the rule gives up (as inconclusive, a
WARNING, never a verdict). Generous on purpose: four fresh interpreters importing torch on a
loaded 2-core machine took over 60 s. ``STATEKEEPER_DOCTOR_TIMEOUT`` (seconds) overrides it;
a child that spins is stopped sooner by its CPU-time limit (``CPU_LIMIT_S``)."""
CPU_LIMIT_S = 300
_TIMEOUT_ENV = "STATEKEEPER_DOCTOR_TIMEOUT"
_MARK = "statekeeper-sk002:"
_CHILD = "from statekeeper.doctor.rules.registration_order import main; main()"
_FIX = (
    "register in a deterministic order: iterate sorted(...) instead of a set (or a dict built "
    "from one), and build the optimizer from model.parameters() or a sorted list, not a set. "
    "statekeeper keys optimizer state by parameter name, so its own resume is safe; "
    "torch.save(optimizer.state_dict()) is not"
)

Entry = tuple[str, tuple[int, ...]]


def describe(spec: str) -> dict[str, Any]:
    """The ordered (name, shape) of the target's parameters, buffers and optimizer parameters."""
    from statekeeper.doctor.target import build_target, load_factory

    factory = load_factory(spec)
    with contextlib.redirect_stdout(sys.stderr):  # the factory's prints must not corrupt ours
        target = build_target(factory, spec=spec)
    model, optimizer = target.model, target.optimizer
    out: dict[str, Any] = {"params": [], "buffers": [], "optimizer": None}
    names: dict[int, str] = {}
    if model is not None:
        out["params"] = [[n, list(p.shape)] for n, p in model.named_parameters()]
        out["buffers"] = [[n, list(b.shape)] for n, b in model.named_buffers()]
        names = {id(p): n for n, p in model.named_parameters()}
    if optimizer is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        out["optimizer"] = [
            [names.get(id(p), f"<not in the model: #{i}>"), list(p.shape)]
            for i, p in enumerate(params)
        ]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Child process: write the description of ``argv[0]`` (a spec) as one marked JSON line."""
    args = list(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(_MARK + json.dumps(describe(args[0])) + "\n")
    sys.stdout.flush()


def _entries(raw: list[list[Any]]) -> list[Entry]:
    return [(str(name), tuple(int(d) for d in shape)) for name, shape in raw]


def _where(name: str) -> str:
    return name.rpartition(".")[0] or "model"


def _first_difference(orders: dict[int, list[Entry]]) -> Entry | None:
    """The reference's entry at the earliest position where any process differs."""
    ref = orders[SEEDS[0]]
    width = max(len(o) for o in orders.values())
    for i in range(width):
        seen = {o[i] if i < len(o) else None for o in orders.values()}
        if len(seen) > 1:
            return ref[i] if i < len(ref) else next(e for e in seen if e is not None)
    return None


def _moved(orders: dict[int, list[Entry]]) -> list[str]:
    positions: dict[str, set[int]] = {}
    for order in orders.values():
        for i, (name, _) in enumerate(order):
            positions.setdefault(name, set()).add(i)
    counts = {name: sum(name in dict(o) for o in orders.values()) for name in positions}
    return [n for n, pos in positions.items() if len(pos) > 1 or counts[n] < len(orders)]


def _show(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _positional(orders: dict[int, list[Entry]]) -> str | None:
    """'crash' if some position holds different shapes across processes, else 'shuffle'."""
    ref = orders[SEEDS[0]]
    if all(o == ref for o in orders.values()):
        return None
    for order in orders.values():
        if len(order) != len(ref) or any(a[1] != b[1] for a, b in zip(order, ref, strict=True)):
            return "crash"
    return "shuffle"


def _timeout() -> float:
    text = os.environ.get(_TIMEOUT_ENV)
    if text is None:
        return TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise InvalidArgumentError(
            f"{_TIMEOUT_ENV}={text!r}: expected a positive number of seconds"
        )
    return value


def _limit_cpu() -> None:
    """In the child, before it runs: a CPU-time limit (a hang that spins ends there)."""
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))


class RegistrationOrder(DoctorRule, id="SK002", severity=Severity.ERROR, needs=SPEC):
    summary = "registration order changes between processes: positional optimizer state shuffles"

    def check(self, target: Target) -> Iterator[Finding]:
        assert target.spec is not None
        described, failure = self._run_children(target.spec)
        if failure:
            yield Finding(
                self.id, Severity.WARNING, "model",
                f"inconclusive: {failure}",
                f"make '{target.spec}' importable and quick to build in a fresh process "
                f"(it is built {len(SEEDS)} times with different PYTHONHASHSEEDs)",
            )  # fmt: skip
            return
        model = {s: _entries(d["params"]) + _entries(d["buffers"]) for s, d in described.items()}
        has_optimizer = described[SEEDS[0]]["optimizer"] is not None
        positional = {
            s: _entries(d["optimizer"] if has_optimizer else d["params"])
            for s, d in described.items()
        }
        first = _first_difference(model) or _first_difference(positional)
        if first is None:
            return
        parts = []
        moved = _moved(model)
        if moved:
            orders = "; ".join(
                f"PYTHONHASHSEED={s}: {_show([n for n, _ in o if n in moved])}"
                for s, o in model.items()
            )
            parts.append(f"the model's parameters/buffers change order ({orders})")
        verdict = _positional(positional)
        if verdict is not None:
            who = "the optimizer's parameters" if has_optimizer else "model.parameters()"
            moved_opt = _moved(positional)
            if verdict == "crash":
                effect = (
                    "a position-keyed resume (torch.save(optimizer.state_dict())) in another "
                    "process would crash: some position holds parameters of different shapes"
                )
            else:
                effect = (
                    "a position-keyed resume (torch.save(optimizer.state_dict())) in another "
                    "process would silently hand each parameter another one's state (the "
                    "shapes agree at every position)"
                )
            count = f"{len(moved_opt)} of {len(positional[SEEDS[0]])} move: {_show(moved_opt)}"
            parts.append(f"{who} change order ({count}); {effect}")
        if not parts:
            parts.append(f"'{first[0]}' has a different shape in different processes")
        yield Finding(
            self.id,
            Severity.ERROR,
            _where(first[0]),
            "built with PYTHONHASHSEED=" + ",".join(map(str, SEEDS)) + ", " + "; ".join(parts),
            _FIX,
            tensor=first[0],
            shape=first[1],
        )

    @staticmethod
    def _run_children(spec: str) -> tuple[dict[int, dict[str, Any]], str]:
        """Each seed's description, or a reason why the comparison is inconclusive."""
        base = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        procs = {
            seed: subprocess.Popen(
                [sys.executable, "-c", _CHILD, spec],
                env=dict(base, PYTHONHASHSEED=str(seed)),
                cwd=os.getcwd(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=_limit_cpu,
            )
            for seed in SEEDS
        }
        limit = _timeout()
        deadline = time.monotonic() + limit
        outputs: dict[int, tuple[str, str]] = {}
        try:
            for seed, proc in procs.items():
                remaining = max(deadline - time.monotonic(), 0.1)
                outputs[seed] = proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            for proc in procs.values():
                proc.kill()
            for proc in procs.values():
                proc.communicate()
            return {}, (
                f"building '{spec}' in {len(SEEDS)} subprocesses took over {limit:g} s, the "
                f"doctor's limit (set {_TIMEOUT_ENV} to allow more)"
            )
        described: dict[int, dict[str, Any]] = {}
        for seed, (stdout, stderr) in outputs.items():
            lines = [ln for ln in stdout.splitlines() if ln.startswith(_MARK)]
            if procs[seed].returncode != 0 or not lines:
                tail = " | ".join(stderr.strip().splitlines()[-3:]) or "no output"
                return {}, (
                    f"building '{spec}' with PYTHONHASHSEED={seed} failed "
                    f"(exit {procs[seed].returncode}): {tail}"
                )
            described[seed] = json.loads(lines[-1][len(_MARK) :])
        return described, ""
