"""Human output of ``statekeeper inspect`` for statekeeper checkpoints (JSON goes through
:func:`statekeeper.cli.render.emit_json`).

A step can hold hundreds of thousands of tensors: tables are :class:`FastTable` and lines
go out through a :class:`LineWriter`, so the output takes time linear in its size (about
3 us a tensor row instead of 300 us with ``rich.table.Table`` and a ``print`` per line).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from statekeeper.cli.render import human_bytes, metrics_text, stdout_console
from statekeeper.cli.render_table import Cell, Col, FastTable

if TYPE_CHECKING:
    from statekeeper.catalog.inspection import EntryReport, InspectReport, TensorRow

__all__ = ["VALUES_SHOWN", "inspection", "shape_text", "tensor_table", "values_table"]

VALUES_SHOWN = 20
"""Non-tensor values listed per entry in human output (--json lists them all)."""

_TENSOR_COLUMNS = (
    Col("tensor"),
    Col("shape", wrap=False),
    Col("dtype", wrap=False),
    Col("bytes", "right", wrap=False),
    Col("note"),
)
_VALUE_COLUMNS = (Col("key"), Col("type", wrap=False), Col("value"))


def shape_text(shape: list[int] | tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def tensor_table(rows: Iterable[tuple[str, Sequence[int], str, int, Text]]) -> FastTable:
    """A table of (name, shape, dtype, bytes, note) rows."""
    return FastTable(
        _TENSOR_COLUMNS,
        (
            (name, shape_text(tuple(shape)), dtype, human_bytes(nbytes), note)
            for name, shape, dtype, nbytes, note in rows
        ),
    )


def values_table(rows: Sequence[tuple[str, str, str]]) -> FastTable:
    """A table of the first VALUES_SHOWN (key, type, value) rows."""
    shown: list[tuple[Cell, ...]] = list(rows[:VALUES_SHOWN])
    hidden = len(rows) - VALUES_SHOWN
    if hidden > 0:
        shown.append((Text(f"... {hidden} more (--json lists all)", style="dim"), "", ""))
    return FastTable(_VALUE_COLUMNS, shown)


_PLAIN = Text("")
_NOTES = {"numpy": Text("numpy array"), "shared": Text("storage shared by aliases", style="cyan")}


def _note(row: TensorRow) -> Text:
    if row.alias_of is not None:
        return Text(f"alias of {row.alias_of}", style="cyan")
    if not row.in_state:
        return _NOTES["shared"]
    if row.chunks:
        return Text(f"sharded in {row.chunks} chunk(s)", style="cyan")
    return _NOTES["numpy"] if row.numpy else _PLAIN


def _entry_table(entry: EntryReport) -> FastTable:
    return tensor_table(
        (row.key or entry.name, row.shape, row.dtype, row.bytes, _note(row))
        for row in entry.tensors
    )


def _values_table(entry: EntryReport) -> FastTable:
    return values_table([(row.key or entry.name, row.type, row.value) for row in entry.values])


def origin_text(origin: Mapping[str, Any]) -> str:
    """One line: where a step was written (host, world, devices, git, command); a field of
    an unexpected shape (another writer's) is shown as it is."""
    parts = [str(origin.get("hostname", "?"))]
    world = origin.get("world_size", 1)
    if world != 1:
        parts.append(f"{world} processes")
    devices = origin.get("devices")
    parts.append(", ".join(map(str, devices)) if isinstance(devices, list) else str(devices or ""))
    git = origin.get("git")
    if isinstance(git, Mapping) and git.get("commit"):
        parts.append(f"git {str(git['commit'])[:12]}{' (dirty)' if git.get('dirty') else ''}")
    elif git:
        parts.append(f"git {git}")
    argv = origin.get("argv")
    parts.append(" ".join(map(str, argv)) if isinstance(argv, list) else str(argv or ""))
    return "    ".join(p for p in parts if p)


def inspection(report: InspectReport) -> None:
    out = LineWriter(stdout_console())
    out.text(f"step {report.step}  {report.path}", "bold")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(report.library.items()))
    out.text(f"created  {report.created}    written by {versions}")
    if report.origin:
        out.text(f"origin   {origin_text(report.origin)}")
    if report.metrics:
        out.text(f"metrics  {metrics_text(report.metrics)}")
    for entry in report.entries:
        out.text()
        if not entry.tensors and len(entry.values) == 1 and not entry.values[0].key:
            out.text(f"{entry.name} ({entry.type}) = {entry.values[0].value}", "bold")
            continue
        parts = []
        if entry.tensors:
            parts.append(f"{len(entry.tensors)} tensor(s), {human_bytes(entry.tensor_bytes)}")
        if entry.values:
            parts.append(f"{len(entry.values)} other value(s)")
        out.text(f"{entry.name} ({entry.type}): {', '.join(parts) or 'empty'}", "bold")
        if entry.tensors:
            out.table(_entry_table(entry))
        if entry.values:
            out.table(_values_table(entry))
    t = report.totals
    out.text()
    out.text(
        f"total: {t.tensors} tensor(s) ({t.stored} stored, {t.aliases} alias(es)), "
        f"{t.tensor_bytes:,} bytes ({human_bytes(t.tensor_bytes)}) of tensor data, "
        f"{t.values} other value(s), {t.files} file(s) ({human_bytes(t.file_bytes)} on disk)",
        "bold",
    )
    if report.reused:
        out.text(
            f"incremental: its save wrote {human_bytes(t.written_bytes)} and reused "
            f"{len(report.reused)} unchanged file(s) of earlier steps"
        )
        for name, source in sorted(report.reused.items()):
            out.text(f"reused: {name} = {source}")
    for name, base in sorted(report.aliases.items()):
        out.text(f"alias: {name} -> {base} (shares its memory)")
    out.flush()


class LineWriter:
    """Lines printed to ``console`` in batches, as ``print(..., soft_wrap=True)`` prints them."""

    BATCH = 4096

    def __init__(self, console: Console) -> None:
        self.console = console
        self._lines: list[list[Segment]] = []
        self._styles: dict[str, Style] = {}

    def text(self, line: str = "", style: str = "") -> None:
        """``console.print(Text(line, style=style), soft_wrap=True)``."""
        if not (line.isascii() and line.isprintable()):
            self.flush()
            self.console.print(Text(line, style=style), soft_wrap=True)
            return
        if style and style not in self._styles:
            self._styles[style] = self.console.get_style(style)
        self._add([Segment(line, self._styles[style] if style else None)] if line else [])

    def table(self, table: FastTable) -> None:
        lines = table.lines(self.console, self.console.options)
        if lines is None:
            self.flush()
            self.console.print(table.rich_table())
            return
        for line in lines:
            self._add(line)

    def _add(self, line: list[Segment]) -> None:
        self._lines.append(line)
        if len(self._lines) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        if self._lines:
            self.console.print(_Batch(self._lines), soft_wrap=True)
            self._lines = []


class _Batch:
    def __init__(self, lines: list[list[Segment]]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        new_line = Segment.line()
        for line in self.lines:
            yield from line
            yield new_line
