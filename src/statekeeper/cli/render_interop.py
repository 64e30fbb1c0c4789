"""Output of ``diff``, ``convert``, ``export`` and of ``ls``/``inspect`` on foreign formats.

Like :mod:`statekeeper.cli.render` (whose helpers it shares), the only place these commands
write to the terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from statekeeper.cli.render import human_bytes, stdout_console
from statekeeper.cli.render_inspect import shape_text, tensor_table, values_table

if TYPE_CHECKING:  # types only: listing a run must not import the foreign readers (torch)
    from statekeeper.interop.convert import ConvertReport
    from statekeeper.interop.diff import DiffReport
    from statekeeper.interop.export import ExportReport
    from statekeeper.interop.foreign_report import FileRow, ForeignReport

__all__ = ["converted", "diff_report", "exported", "foreign_inspection", "foreign_listing"]


def _num(x: float) -> str:
    return f"{x:.3g}"


def diff_report(result: DiffReport, shown: int) -> None:
    """Keys on one side only, changed kinds/shapes/dtypes/values, then the tensors that
    differ, largest difference first; equal ones are counted."""
    out = stdout_console()
    out.print(Text(f"A: {result.a}\nB: {result.b}"), soft_wrap=True)
    for note in result.notes:
        out.print(Text(f"note: {note}", style="dim"), soft_wrap=True)
    for label, keys in (("only in A", result.only_a), ("only in B", result.only_b)):
        if keys:
            out.print(Text(f"{len(keys)} key(s) {label}:", style="bold yellow"))
            for key in keys[:shown]:
                out.print(Text(f"  {key}"), soft_wrap=True)
            if len(keys) > shown:
                out.print(Text(f"  ... {len(keys) - shown} more (--json lists all)", style="dim"))
    if result.changed:
        table = Table(title=Text("changed", style="bold yellow"), title_justify="left")
        for column in ("key", "what", "A", "B"):
            table.add_column(column, overflow="fold")
        for change in result.changed[:shown]:
            table.add_row(change.key, change.what, change.a, change.b)
        out.print(table)
    if result.different:
        title = f"{len(result.different)} tensor(s) differ (atol={result.atol}, rtol={result.rtol})"
        table = Table(title=Text(title, style="bold red"), title_justify="left")
        table.add_column("tensor", overflow="fold")
        table.add_column("shape", no_wrap=True)
        table.add_column("dtype", no_wrap=True)
        table.add_column("max abs diff", justify="right")
        table.add_column("max rel diff", justify="right")
        for d in result.different[:shown]:
            dtype = d.dtype_a if d.dtype_a == d.dtype_b else f"{d.dtype_a} -> {d.dtype_b}"
            table.add_row(d.key, shape_text(d.shape), dtype, _num(d.max_abs), _num(d.max_rel))
        if len(result.different) > shown:
            table.add_row(Text(f"... {len(result.different) - shown} more", style="dim"), "", "",
                          "", "")  # fmt: skip
        out.print(table)
    summary = f"{len(result.equal_tensors)} tensor(s) and {result.equal_values} value(s) equal"
    out.print(Text(summary), soft_wrap=True)
    if result.equal:
        out.print(Text("equal", style="bold green"))
    else:
        counts = (
            f"{len(result.only_a)} only in A, {len(result.only_b)} only in B, "
            f"{len(result.changed)} changed, {len(result.different)} tensor(s) differ"
        )
        out.print(Text(f"different: {counts}", style="bold red"), soft_wrap=True)


def converted(result: ConvertReport) -> None:
    out = stdout_console()
    if result.kind == "statekeeper":
        where = f"step {result.step}  {result.path}"
        line = f"{result.source} ({result.source_format}) -> {where}"
        out.print(Text(line, style="bold green"), soft_wrap=True)
        entries = ", ".join(result.entries)
        out.print(Text(f"entries: {entries}; {result.tensors} tensor(s), "
                       f"{human_bytes(result.bytes)}"), soft_wrap=True)  # fmt: skip
        if result.wrapped_as:
            out.print(Text(f"the whole source was saved under the entry {result.wrapped_as!r}"))
        return
    line = f"{result.source} ({result.source_format}) -> {result.path}"
    out.print(Text(line, style="bold green"), soft_wrap=True)
    out.print(Text(f"{result.tensors} tensor(s), {human_bytes(result.bytes)}"), soft_wrap=True)
    _aliases_and_dropped(out, result.aliases, result.dropped)


def _aliases_and_dropped(out: Console, aliases: dict[str, str], dropped: tuple[str, ...]) -> None:
    for alias, base in sorted(aliases.items()):
        out.print(Text(f"alias: {alias} -> {base} (stored once)"), soft_wrap=True)
    if dropped:
        out.print(
            Text(f"dropped {len(dropped)} non-tensor value(s): {', '.join(dropped)}",
                 style="yellow"),
            soft_wrap=True,
        )  # fmt: skip


def exported(result: ExportReport) -> None:
    out = stdout_console()
    what = f"entry {result.key!r}" if result.key else "the whole state"
    line = (
        f"exported {what}: {result.tensors} tensor(s) ({result.stored} stored), "
        f"{human_bytes(result.bytes)}" + (f", cast to {result.dtype}" if result.dtype else "")
    )
    out.print(Text(line, style="bold green"), soft_wrap=True)
    out.print(Text(f"-> {result.path}"), soft_wrap=True)
    _aliases_and_dropped(out, result.aliases, result.dropped)


def foreign_listing(path: str, fmt: str, files: list[FileRow]) -> None:
    out = stdout_console()
    table = Table(title=Text(f"{path}  ({fmt})"), title_justify="left")
    table.add_column("file", overflow="fold")
    table.add_column("size", justify="right")
    table.add_column("holds", overflow="fold")
    for row in files:
        table.add_row(row.name, human_bytes(row.bytes), row.role)
    out.print(table)
    total = sum(row.bytes for row in files)
    out.print(Text(f"{len(files)} file(s), {human_bytes(total)}; format {fmt}, not a "
                   "statekeeper run (statekeeper convert makes one)"), soft_wrap=True)  # fmt: skip


def _alias_note(alias_of: str | None) -> Text:
    return Text(f"alias of {alias_of}", style="cyan") if alias_of else Text("")


def foreign_inspection(desc: ForeignReport) -> None:
    out = stdout_console()
    out.print(Text(f"{desc.path}  ({desc.format})", style="bold"), soft_wrap=True)
    if desc.tensors:
        out.print(
            tensor_table(
                (row.key, row.shape, row.dtype, row.bytes, _alias_note(row.alias_of))
                for row in desc.tensors
            )
        )
    if desc.values:
        out.print(values_table([(v.key, v.type, v.value) for v in desc.values]))
    aliases = sum(1 for row in desc.tensors if row.alias_of)
    out.print(
        Text(
            f"total: {len(desc.tensors)} tensor(s) ({aliases} alias(es)), {desc.tensor_bytes:,} "
            f"bytes ({human_bytes(desc.tensor_bytes)}) of tensor data, {len(desc.values)} other "
            f"value(s), {len(desc.files)} file(s) ({human_bytes(desc.file_bytes)} on disk)",
            style="bold",
        ),
        soft_wrap=True,
    )
