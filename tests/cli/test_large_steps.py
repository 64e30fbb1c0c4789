"""Commands on steps with many tensors do work linear in the number of tensors (issue #14).

``inspect`` of 300,000 tensors took 94 s: rich rendered every table cell through its general
machinery (about 1,200 Python calls a tensor row) and printed line by line. Nothing here
measures time (the machine is shared): the tests count Python function calls for N, 2N and
4N tensors and bound both the growth and the calls per tensor, and check that the fast
table prints exactly what ``rich.table.Table`` prints.
"""

from __future__ import annotations

import io
import random
import re
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import rich.table
import torch
from click.testing import CliRunner
from rich.console import Console
from rich.text import Text

import statekeeper as sk
from statekeeper.cli.main import main
from statekeeper.cli.render_inspect import LineWriter
from statekeeper.cli.render_table import Col, FastTable
from statekeeper.interop.safetensors_files import write_safetensors

SIZES = (250, 500, 1000)


def _calls(args: list[str], columns: int = 120) -> int:
    """Python function calls made by ``statekeeper *args``."""
    count = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call":
            count += 1

    runner = CliRunner(env={"COLUMNS": str(columns)})
    sys.setprofile(profile)
    try:
        result = runner.invoke(main, args)
    finally:
        sys.setprofile(None)
    assert result.exit_code == 0, result.output
    return count


def _step(tmp: Path, n: int) -> Path:
    run = tmp / f"run{n}"
    if not run.exists():
        sk.save(run, {"model": {f"layers.{i}.weight": torch.zeros(2) for i in range(n)}}, step=1)
    return run


def _entries(tmp: Path, n: int) -> Path:  # a flat state dict saved as it is: an entry a tensor
    run = tmp / f"top{n}"
    sk.save(run, {f"layers.{i}.weight": torch.zeros(2) for i in range(n)}, step=1)
    return run


def _long_names(tmp: Path, n: int) -> Path:  # names that fold in a narrow terminal
    run = tmp / f"long{n}"
    prefix = "model.decoder.layers.block_with_a_long_name."
    state = {f"{prefix}{i}.self_attention.q_proj.weight": torch.zeros(2) for i in range(n)}
    sk.save(run, {"model": state}, step=1)
    return run


def _safetensors(tmp: Path, n: int) -> Path:
    path = tmp / f"weights{n}.safetensors"
    write_safetensors(path, {f"model.layers.{i}.weight": torch.zeros(1) for i in range(n)})
    return path


CASES: dict[str, tuple[Callable[[Path, int], list[str]], int, int]] = {
    # name: (arguments, terminal width, most calls a tensor; the old code needed about
    # 1,170 / 380 / 3,120 / 1,160 for the four inspect rows)
    "inspect": (lambda t, n: ["inspect", str(_step(t, n))], 120, 100),
    "inspect --json": (lambda t, n: ["inspect", "--json", str(_step(t, n))], 120, 120),
    "inspect entries": (lambda t, n: ["inspect", str(_entries(t, n))], 120, 600),
    "inspect safetensors": (lambda t, n: ["inspect", str(_safetensors(t, n))], 120, 100),
    "inspect folded": (lambda t, n: ["inspect", str(_long_names(t, n))], 60, 150),
    "ls": (lambda t, n: ["ls", str(_step(t, n))], 120, 30),
    "verify": (lambda t, n: ["verify", str(_step(t, n))], 120, 60),
    "diff": (lambda t, n: ["diff", str(_step(t, n)), str(_step(t, n))], 120, 100),
}


@pytest.mark.parametrize("case", list(CASES))
def test_work_is_linear_in_the_tensors(tmp_path: Path, case: str) -> None:
    build, columns, per_tensor = CASES[case]
    _calls(build(tmp_path / "warm-up", SIZES[0]), columns)  # commands load lazily: load them
    calls = [_calls(build(tmp_path, n), columns) for n in SIZES]
    grew = [b - a for a, b in pairwise(calls)]
    added = [b - a for a, b in pairwise(SIZES)]
    assert all(g <= per_tensor * n for g, n in zip(grew, added, strict=True)), (calls, per_tensor)
    assert grew[1] <= 2.5 * grew[0], calls  # quadratic work would quadruple


def test_inspect_prints_in_batches_without_rich_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = {"print": 0, "table": 0}
    print_, render = Console.print, rich.table.Table.__rich_console__

    def counted_print(self: Console, *args: Any, **kwargs: Any) -> None:
        counts["print"] += 1
        print_(self, *args, **kwargs)

    def counted_render(self: rich.table.Table, *args: Any) -> Any:
        counts["table"] += 1
        return render(self, *args)

    monkeypatch.setattr(Console, "print", counted_print)
    monkeypatch.setattr(rich.table.Table, "__rich_console__", counted_render)
    result = CliRunner().invoke(main, ["inspect", str(_step(tmp_path, 5000))])
    rows = [line for line in result.stdout.splitlines() if line.startswith("layers.")]
    assert result.exit_code == 0 and len(rows) == 5000  # not a count of "layers." anywhere:
    # the origin line shows the test process's own command line, which may name test_layers.py
    assert counts == {"print": 2, "table": 0}  # 5,000 table lines and 7 more: two batches


# --- the fast table prints what rich prints --------------------------------------------------

COLUMNS = (Col("tensor"), Col("shape", wrap=False), Col("dtype", wrap=False),
           Col("bytes", "right", wrap=False), Col("note"))  # fmt: skip


def _cell(rng: random.Random) -> str:
    word = "".join(rng.choice("abcdefghij._/0123456789") for _ in range(rng.choice([1, 9, 30, 90])))
    return rng.choice([word, word, word, f"{word[:5]} {word}", f"ünï{word[:9]}", f"[bold]{word}"])


def _note(rng: random.Random) -> Text:
    return rng.choice([
        Text(""), Text(""), Text("numpy array"), Text(f"alias of {_cell(rng)}", style="cyan"),
        Text.assemble(("spans", "red"), " and ", ("more", "green")),
    ])  # fmt: skip


def _printed(table: Any, width: int, color: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, highlight=False, force_terminal=color,
                      color_system="truecolor" if color else None)  # fmt: skip
    console.print(table)
    return out.getvalue()


def _styled(ansi: str) -> list[tuple[str, str]]:
    """Each character with its style (the style of a blank does not show)."""
    return [(c, str(s.style) if s.style and c.strip() else "")
            for s in Text.from_ansi(ansi).render(Console()) for c in s.text]  # fmt: skip


@pytest.mark.parametrize("width", [30, 45, 60, 80, 120, 200])
@pytest.mark.parametrize("color", [False, True], ids=["plain", "color"])
def test_fast_table_prints_what_rich_prints(width: int, color: bool) -> None:
    rng = random.Random(width)
    for _ in range(40):
        rows = [
            (_cell(rng), f"({rng.randint(1, 50000)}, {rng.randint(1, 9)})", rng.choice(
                ["float32", "bfloat16"]), f"{rng.randint(0, 9999)} B", _note(rng))
            for _ in range(rng.choice([1, 2, 6]))
        ]  # fmt: skip
        table = FastTable(COLUMNS, rows)
        fast, slow = _printed(table, width, color), _printed(table.rich_table(), width, color)
        if color:
            assert re.sub("\x1b\\[[0-9;]*m", "", fast) == re.sub("\x1b\\[[0-9;]*m", "", slow)
            assert _styled(fast) == _styled(slow)
        else:
            assert fast == slow


def test_cells_are_never_markup() -> None:
    table = FastTable([Col("key")], [("[bold]x[/bold] :smile:",)])
    assert "[bold]x[/bold] :smile:" in _printed(table, 80, False)


@pytest.mark.parametrize("line", ["plain", "", "ünïcode", "tab\there", "a" * 300])
@pytest.mark.parametrize("style", ["", "bold"])
def test_line_writer_prints_what_print_prints(line: str, style: str) -> None:
    printed = []
    for fast in (True, False):
        out = io.StringIO()
        console = Console(file=out, width=80, force_terminal=True, color_system="standard")
        if fast:
            writer = LineWriter(console)
            writer.text(line, style)
            writer.flush()
        else:
            console.print(Text(line, style=style), soft_wrap=True)
        printed.append(out.getvalue())
    assert printed[0] == printed[1]
