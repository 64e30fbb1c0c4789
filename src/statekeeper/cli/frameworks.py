"""``ls`` and ``verify`` of a folder of framework checkpoints (a Lightning ``ModelCheckpoint``
directory, a transformers ``Trainer`` output directory, an Accelerate project directory):
parsing and rendering only; the folder is :mod:`statekeeper.catalog.frameworks`'s, the
checks :mod:`statekeeper.interop.framework_verify`'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import click
from rich.table import Table
from rich.text import Text

from statekeeper.catalog.detect import Format
from statekeeper.catalog.frameworks import FrameworkEntry, FrameworkFolder
from statekeeper.catalog.listing import list_checkpoints, list_partial
from statekeeper.cli import render
from statekeeper.interop.framework_verify import (
    EntryStatus,
    EntryVerifyReport,
    FrameworkVerifyReport,
    verify_framework,
)

__all__ = ["list_framework_folder", "verify_framework_folder"]

_NO_CHECKSUMS = "no checksums: read with `statekeeper inspect`, checked by `statekeeper verify`"


def _entries(count: int, framework: str) -> str:
    return f"{count} {framework} entr{'y' if count == 1 else 'ies'}"


Listing = Callable[..., dict[str, Any]]
"""``statekeeper.cli.ls.listing_json``: handed in by ``ls`` (which imports this module)."""


def _entry_json(entry: FrameworkEntry, listing_json: Listing) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": entry.name,
        "path": entry.path,
        "step": entry.step,
        "format": None if entry.format is None else str(entry.format),
        "bytes": entry.bytes,
        "error": entry.error,
        "checkpoints": [],
        "partial": [],
    }
    if entry.format is Format.STATEKEEPER:
        listed = listing_json(entry.path, list_checkpoints(entry.path), list_partial(entry.path))
        out["checkpoints"], out["partial"] = listed["checkpoints"], listed["partial"]
    return out


def list_framework_folder(folder: FrameworkFolder, as_json: bool, listing_json: Listing) -> None:
    """``statekeeper ls`` of a framework folder: each entry, with the statekeeper steps that
    an entry holds (size, created, metrics, damaged manifests flagged), each as
    ``listing_json`` makes the rows of a run directory."""
    with render.reported_errors():
        rows = [_entry_json(e, listing_json) for e in folder.entries]
    if as_json:
        render.emit_json(
            {"directory": folder.path, "framework": str(folder.framework), "entries": rows}
        )
        return
    table = Table(title=Text(f"{folder.path} ({folder.framework})"), title_justify="left")
    for name, justify in (("entry", "left"), ("step", "right"), ("format", "left"),
                          ("size", "right"), ("created", "left"), ("metrics", "left"),
                          ("status", "left")):  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        step = "-" if row["step"] is None else str(row["step"])
        size = render.human_bytes(row["bytes"])
        if row["error"] is not None:
            status = Text(f"unreadable: {row['error']}", style="red")
            table.add_row(row["name"], step, row["format"] or "?", size, "-", "", status)
        elif row["format"] != str(Format.STATEKEEPER):
            status = Text(_NO_CHECKSUMS, style="yellow")
            table.add_row(row["name"], step, row["format"], size, "-", "", status)
        for info in row["checkpoints"]:
            ok = info["error"] is None
            table.add_row(
                row["name"],
                str(info["step"]),
                "statekeeper",
                render.human_bytes(info["bytes"]) if ok else "-",
                (info["created"] or "unknown").replace("T", " ")[:19] if ok else "-",
                render.metrics_text(info["metrics"]),
                Text("ok", style="green") if ok else Text(f"damaged: {info['error']}", "red"),
            )
        for partial in row["partial"]:
            note = Text(f"{render.PARTIAL_NOTE}: {partial['name']}", style="yellow")
            table.add_row(row["name"], str(partial["step"]), "statekeeper", "-", "-", "", note)
    console = render.stdout_console()
    console.print(table)
    steps = sum(len(r["checkpoints"]) for r in rows)
    foreign = sum(1 for r in rows if r["format"] not in (None, str(Format.STATEKEEPER)))
    summary = _entries(len(rows), folder.framework)
    summary += f", {steps} statekeeper step(s)"
    if foreign:
        summary += f", {foreign} without checksums (the framework's own format)"
    console.print(Text(summary), soft_wrap=True)


_LABELS = {
    EntryStatus.VERIFIED: ("OK     ", "green"),
    EntryStatus.READ: ("READ   ", "yellow"),
    EntryStatus.REFUSED: ("REFUSED", "yellow"),
    EntryStatus.DAMAGED: ("FAILED ", "red"),
}


def _entry_line(result: EntryVerifyReport) -> Text:
    label, style = _LABELS[result.status]
    steps = [s.step for s in result.steps if s.step is not None]
    if result.step is None and steps:
        step = f"step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}"
    else:
        step = f"step {result.step}" if result.step is not None else "-"
    text = f"{label} {step}  {result.name}  {render.human_bytes(result.bytes)}"
    if result.status is EntryStatus.VERIFIED:
        text += f"  ({len(result.steps)} statekeeper step(s), every byte checked)"
    elif result.status is EntryStatus.READ:
        text += f"  ({result.format}: no checksums; read in full by the safe readers"
        if result.unread:
            text += f"; not read: {', '.join(result.unread)}"
        text += ")"
    else:
        text += f"  {result.error}"
    return Text(text, style=style)


def _summary(report: FrameworkVerifyReport) -> Text:
    counts = {s: sum(1 for e in report.entries if e.status is s) for s in EntryStatus}
    parts = [f"{counts[EntryStatus.VERIFIED]} verified"]
    if counts[EntryStatus.READ]:
        parts.append(f"{counts[EntryStatus.READ]} read without checksums (convert them "
                     "with `statekeeper convert` for checksums)")  # fmt: skip
    if counts[EntryStatus.REFUSED]:
        parts.append(f"{counts[EntryStatus.REFUSED]} refused (only pickle could load them)")
    if counts[EntryStatus.DAMAGED]:
        parts.append(f"{counts[EntryStatus.DAMAGED]} damaged")
    style = "bold red" if not report.ok else "bold green"
    return Text(f"{_entries(len(report.entries), report.framework)}: " + ", ".join(parts), style)


def verify_framework_folder(folder: FrameworkFolder, step: int | None, as_json: bool) -> NoReturn:
    """``statekeeper verify`` of a framework folder; exit 0 when no entry is damaged, 1 when
    one is, 2 when ``--step`` matches none."""
    with render.reported_errors():
        report = verify_framework(folder, step=step)
    if not report.entries:
        render.fail(
            f"{folder.path}: no {folder.framework} entry of step {step}; run `statekeeper ls "
            f"{folder.path}` for the steps there",
            2,
        )
    if as_json:
        render.emit_json(report)
    else:
        for result in report.entries:
            render.stdout_console().print(_entry_line(result), soft_wrap=True)
        render.stdout_console().print(_summary(report), soft_wrap=True)
    raise click.exceptions.Exit(0 if report.ok else 1)
