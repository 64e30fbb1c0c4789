"""Human output of ``statekeeper inspect`` for statekeeper checkpoints (JSON goes through
:func:`statekeeper.cli.render.emit_json`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from statekeeper.cli.render import human_bytes, metrics_text, stdout_console

if TYPE_CHECKING:
    from statekeeper.cli.inspect import EntryReport, Report, TensorRow

__all__ = ["VALUES_SHOWN", "inspection", "shape_text", "tensor_table", "values_table"]

VALUES_SHOWN = 20
"""Non-tensor values listed per entry in human output (--json lists them all)."""


def shape_text(shape: list[int] | tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def tensor_table(rows: Iterable[tuple[str, Sequence[int], str, int, Text]]) -> Table:
    """A table of (name, shape, dtype, bytes, note) rows."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("tensor", overflow="fold")
    table.add_column("shape", no_wrap=True)
    table.add_column("dtype", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("note", overflow="fold")
    for name, shape, dtype, nbytes, note in rows:
        table.add_row(name, shape_text(tuple(shape)), dtype, human_bytes(nbytes), note)
    return table


def values_table(rows: Sequence[tuple[str, str, str]]) -> Table:
    """A table of the first VALUES_SHOWN (key, type, value) rows."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("key", overflow="fold")
    table.add_column("type", no_wrap=True)
    table.add_column("value", overflow="fold")
    for row in rows[:VALUES_SHOWN]:
        table.add_row(*row)
    hidden = len(rows) - VALUES_SHOWN
    if hidden > 0:
        table.add_row(Text(f"... {hidden} more (--json lists all)", style="dim"), "", "")
    return table


def _note(row: TensorRow) -> Text:
    if row.alias_of is not None:
        return Text(f"alias of {row.alias_of}", style="cyan")
    if not row.in_state:
        return Text("storage shared by aliases", style="cyan")
    if row.chunks:
        return Text(f"sharded in {row.chunks} chunk(s)", style="cyan")
    return Text("numpy array" if row.numpy else "")


def _entry_table(entry: EntryReport) -> Table:
    return tensor_table(
        (row.key or entry.name, row.shape, row.dtype, row.bytes, _note(row))
        for row in entry.tensors
    )


def _values_table(entry: EntryReport) -> Table:
    return values_table([(row.key or entry.name, row.type, row.value) for row in entry.values])


def inspection(report: Report) -> None:
    console = stdout_console()
    console.print(Text(f"step {report.step}  {report.path}", style="bold"), soft_wrap=True)
    versions = ", ".join(f"{k} {v}" for k, v in sorted(report.library.items()))
    console.print(Text(f"created  {report.created}    written by {versions}"), soft_wrap=True)
    if report.metrics:
        console.print(Text(f"metrics  {metrics_text(report.metrics)}"), soft_wrap=True)
    for entry in report.entries:
        console.print()
        if not entry.tensors and len(entry.values) == 1 and not entry.values[0].key:
            line = f"{entry.name} ({entry.type}) = {entry.values[0].value}"
            console.print(Text(line, style="bold"), soft_wrap=True)
            continue
        parts = []
        if entry.tensors:
            parts.append(f"{len(entry.tensors)} tensor(s), {human_bytes(entry.tensor_bytes)}")
        if entry.values:
            parts.append(f"{len(entry.values)} other value(s)")
        head = f"{entry.name} ({entry.type}): {', '.join(parts) or 'empty'}"
        console.print(Text(head, style="bold"), soft_wrap=True)
        if entry.tensors:
            console.print(_entry_table(entry))
        if entry.values:
            console.print(_values_table(entry))
    t = report.totals
    console.print()
    console.print(
        Text(
            f"total: {t.tensors} tensor(s) ({t.stored} stored, {t.aliases} alias(es)), "
            f"{t.tensor_bytes:,} bytes ({human_bytes(t.tensor_bytes)}) of tensor data, "
            f"{t.values} other value(s), {t.files} file(s) ({human_bytes(t.file_bytes)} on disk)",
            style="bold",
        ),
        soft_wrap=True,
    )
    for name, base in sorted(report.aliases.items()):
        console.print(Text(f"alias: {name} -> {base} (shares its memory)"), soft_wrap=True)
