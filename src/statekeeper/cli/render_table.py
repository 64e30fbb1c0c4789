"""Tables printed in time linear in their size.

rich renders each table cell through its general machinery, about 60 us a cell:
``statekeeper inspect`` of a step of 300,000 tensors took 94 s, nearly all of it there.
:class:`FastTable` lays a table out exactly as ``Table(show_edge=False, pad_edge=False)``
does (the same widths, folding, box characters and styles) but writes the cells that are
printable ASCII itself; only other cells go through rich, one cell at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from rich import box
from rich.console import Console, ConsoleOptions, JustifyMethod, OverflowMethod, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

__all__ = ["Cell", "Col", "FastTable"]

Cell = str | Text
"""A table cell: a plain string (never read as console markup) or a ``Text``."""
_Piece = tuple[str, Style | None]
_Lines = list[list[_Piece]]  # one cell: its lines, each a list of (text, style)
_Row = tuple[Cell, ...]


class Col(NamedTuple):
    header: str
    justify: JustifyMethod = "left"  # "left" or "right"
    wrap: bool = True  # True: long cells fold; False: no_wrap, cut with an ellipsis


class FastTable:
    """A ``Table(show_edge=False, pad_edge=False)`` of text cells, rendered in linear time.

    Widths are the natural ones (each column's widest cell) when they fit, else rich's own
    computation run on a probe table of the few rows that hold each column's widest cell and
    longest word (the only inputs of that computation). A cell that fits on one line is
    written directly, a long word without spaces is folded into chunks as rich folds it, and
    any other cell (non-ASCII, styled spans, spaces to wrap at, too long for a no-wrap
    column) is rendered by rich alone. Where only rich can lay the table out (no rows, a
    header that does not fit), the table is handed to rich whole.
    """

    def __init__(self, columns: Sequence[Col], rows: Iterable[Sequence[Cell]]) -> None:
        self.columns = list(columns)
        self.rows: list[_Row] = [tuple(row) for row in rows]

    def rich_table(self, rows: Sequence[Sequence[Cell]] | None = None) -> Table:
        """The same table as a ``rich.table.Table`` (of ``rows``, default all)."""
        table = Table(show_edge=False, pad_edge=False)
        for c in self.columns:
            overflow: OverflowMethod = "fold" if c.wrap else "ellipsis"
            table.add_column(c.header, justify=c.justify, no_wrap=not c.wrap, overflow=overflow)
        for row in self.rows if rows is None else rows:
            table.add_row(*(Text(c) if isinstance(c, str) else c for c in row))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = self.lines(console, options)
        if lines is None:
            yield self.rich_table()
            return
        for line in lines:
            yield from line
            yield Segment.line()

    def lines(self, console: Console, options: ConsoleOptions) -> list[list[Segment]] | None:
        """The rendered lines, without newlines; None where only rich can lay it out."""
        n = len(self.columns)
        if not self.rows or not n:
            return None
        pads = [(i > 0) + (i < n - 1) for i in range(n)]
        cols = [_Column.of([row[i] for row in self.rows], console) for i in range(n)]
        widths = self._widths(console, options, cols, pads)
        if widths is None:
            return None
        inner = [w - p for w, p in zip(widths, pads, strict=True)]
        if min(inner) < 1 or any(
            len(c.header) > w for c, w in zip(self.columns, inner, strict=True)
        ):
            return None
        b = box.HEAVY_HEAD.substitute(options, safe=console.safe_box)
        bold: Style | None = console.get_style("table.header")
        head: list[_Lines] = [
            [[(_justify(c.header, w, c.justify), bold)]]
            for c, w in zip(self.columns, inner, strict=True)
        ]
        out = _join(head, inner, b.head_vertical, bold)
        out.append([Segment(b.get_row(widths, "head", edge=False))])
        just = [
            col.justified(w, c.justify) for col, w, c in zip(cols, inner, self.columns, strict=True)
        ]
        styled = [col.styles for col in cols if col.styles is not None]
        last = len(self.rows) - 1
        for r, cells in enumerate(zip(*just, strict=True)):
            bar = b.foot_vertical if r == last else b.mid_vertical
            if None in cells:  # a cell to fold or to hand to rich
                out.extend(self._row(console, options, cols, r, inner, bar))
            elif not any(styles[r] for styles in styled):
                out.append([Segment(f" {bar} ".join(cells))])
            else:
                pieces: list[_Piece] = []
                for i, text in enumerate(cells):
                    if i:
                        pieces.append((f" {bar} ", None))
                    pieces.append((text or "", cols[i].style(r)))
                out.append(_merge(pieces))
        return out

    def _row(
        self, console: Console, options: ConsoleOptions, cols: list[_Column], r: int,
        inner: list[int], bar: str,
    ) -> list[list[Segment]]:  # fmt: skip
        parts: list[_Lines] = []
        for i, col in enumerate(cols):
            c, w, text, style = self.columns[i], inner[i], col.texts[r], col.style(r)
            simple = col.simple is None or col.simple[r]
            if simple and len(text) <= w:
                parts.append([[(_justify(text, w, c.justify), style)]])
            elif simple and c.wrap and " " not in text:  # one long word: rich folds it so
                chunks = [text[j : j + w] for j in range(0, len(text), w)]
                parts.append([[(_justify(chunk, w, c.justify), style)] for chunk in chunks])
            else:
                parts.append(_rich_cell(console, options, self.rows[r][i], c, w))
        return _join(parts, inner, bar, None)

    def _widths(
        self, console: Console, options: ConsoleOptions, cols: list[_Column], pads: list[int]
    ) -> list[int] | None:
        """Column widths with their padding, as ``Table`` computes them."""
        widest = [col.widest(console, options, self.rows, i) for i, col in enumerate(cols)]
        natural = [
            (max(len(c.header), max(w)) + p) or 1
            for c, w, p in zip(self.columns, widest, pads, strict=True)
        ]
        room = options.max_width - (len(cols) - 1)
        if sum(natural) <= room:
            return natural
        picked: set[int] = set()  # the rows that hold each column's widest line and longest word
        for i, col in enumerate(cols):
            longest = col.longest(console, options, self.rows, i)
            picked.update((widest[i].index(max(widest[i])), longest.index(max(longest))))
        probe = self.rich_table([self.rows[r] for r in sorted(picked)])
        try:  # rich's own algorithm, on a probe that holds every cell deciding it
            found: list[int] = probe._calculate_column_widths(console, options.update_width(room))
        except (AttributeError, TypeError):  # a rich without it: rich renders the table
            return None
        return found


class _Column(NamedTuple):
    """One column's cells: texts, styles (None: no cell has one) and whether each is simple
    (printable ASCII in at most one style; None: every cell is)."""

    texts: list[str]
    styles: list[Style | None] | None
    simple: list[bool] | None

    @classmethod
    def of(cls, cells: list[Cell], console: Console) -> _Column:
        if set(map(type, cells)) == {str}:
            texts: list[str] = cells  # type: ignore[assignment]
            joined = "".join(texts)
            if joined.isascii() and joined.isprintable():
                return cls(texts, None, None)
            return cls(texts, None, [t.isascii() and t.isprintable() for t in texts])
        texts = [c if isinstance(c, str) else c.plain for c in cells]
        found: dict[str | Style, Style] = {}
        styles: list[Style | None] = []
        simple: list[bool] = []
        for c, t in zip(cells, texts, strict=True):
            plain = t.isascii() and t.isprintable()
            if isinstance(c, str) or not c.style:
                styles.append(None)
            else:
                styles.append(
                    found.get(c.style) or found.setdefault(c.style, console.get_style(c.style))
                )
            if isinstance(c, Text):
                plain = plain and not (c.spans or c.justify or c.overflow or c.no_wrap)
            simple.append(plain)
        return cls(texts, styles if found else None, None if all(simple) else simple)

    def style(self, r: int) -> Style | None:
        return None if self.styles is None else self.styles[r]

    def widest(
        self, console: Console, options: ConsoleOptions, rows: list[_Row], i: int
    ) -> list[int]:
        """Each cell's widest line, as rich measures it."""
        if self.simple is None:
            return list(map(len, self.texts))
        return [len(t) if self.simple[r] else _measure(console, options, rows[r][i]).maximum
                for r, t in enumerate(self.texts)]  # fmt: skip

    def longest(
        self, console: Console, options: ConsoleOptions, rows: list[_Row], i: int
    ) -> list[int]:
        """Each cell's longest word, as rich measures it."""
        return [
            max(map(len, t.split()), default=len(t))
            if self.simple is None or self.simple[r]
            else _measure(console, options, rows[r][i]).minimum
            for r, t in enumerate(self.texts)
        ]

    def justified(self, width: int, how: JustifyMethod) -> list[str | None]:
        """Each cell justified to ``width``, or None where it is not simple or too long."""
        if self.simple is None and max(map(len, self.texts)) <= width:
            if how == "right":
                return [t.rstrip().rjust(width) for t in self.texts]
            return [t.ljust(width) for t in self.texts]
        return [
            _justify(t, width, how)
            if (self.simple is None or self.simple[r]) and len(t) <= width
            else None
            for r, t in enumerate(self.texts)
        ]


def _measure(console: Console, options: ConsoleOptions, cell: Cell) -> Measurement:
    return Measurement.get(console, options, Text(cell) if isinstance(cell, str) else cell)


def _justify(text: str, width: int, how: JustifyMethod) -> str:
    return text.rstrip().rjust(width) if how == "right" else text.ljust(width)


def _rich_cell(
    console: Console, options: ConsoleOptions, cell: Cell, col: Col, width: int
) -> _Lines:
    text = Text(cell) if isinstance(cell, str) else cell
    opts = options.update(
        width=width,
        justify=col.justify,
        no_wrap=not col.wrap,
        overflow="fold" if col.wrap else "ellipsis",
        height=None,
        highlight=False,
    )
    return [[(s.text, s.style) for s in line] for line in console.render_lines(text, opts)]


def _join(
    parts: list[_Lines], widths: list[int], bar: str, style: Style | None
) -> list[list[Segment]]:
    """One row's cells joined into lines: padding, dividers, blank lines under short cells."""
    last = len(parts) - 1
    out: list[list[Segment]] = []
    for k in range(max(len(p) for p in parts)):
        pieces: list[_Piece] = []
        for i, cell in enumerate(parts):
            if i:
                pieces.append((" ", style))
            pieces.extend(cell[k] if k < len(cell) else [(" " * widths[i], style)])
            if i < last:
                pieces += [(" ", style), (bar, None)]
        out.append(_merge(pieces))
    return out


def _merge(pieces: list[_Piece]) -> list[Segment]:
    """Adjacent pieces of the same style as one segment."""
    line: list[Segment] = []
    text, style = pieces[0]
    for t, s in pieces[1:]:
        if s == style:
            text += t
        else:
            line.append(Segment(text, style))
            text, style = t, s
    line.append(Segment(text, style))
    return line
