"""All output of the command line: rich for people, JSON for programs.

This module and its siblings ``render_inspect``, ``render_interop`` and ``render_doctor``
(which print through
:func:`stdout_console`) are the only ones of statekeeper that write to the terminal.
Commands build plain data and hand it here; nothing else prints.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.catalog.naming import ParsedEntry
from statekeeper.cli.render_json import emit_json
from statekeeper.errors import InvalidArgumentError, StatekeeperError, StepNotFoundError
from statekeeper.progress import Progress as ProgressCallback

if TYPE_CHECKING:
    from statekeeper.catalog.verification import StepVerifyReport, VerifyReport

__all__ = [
    "ByteProgress",
    "averaged",
    "emit_json",
    "error",
    "fail",
    "human_bytes",
    "listing",
    "metrics_text",
    "reported_errors",
    "stdout_console",
    "verify_step",
    "verify_summary",
]

PARTIAL_NOTE = "partial (interrupted save, never read)"
_NOTES = {
    "partial": PARTIAL_NOTE,
    "removing": "being deleted (an interrupted removal, never read)",
    "replaced": "superseded copy (an overwrite replaced it, never read)",
    "damaged": "damaged, set aside by a restarted run (evidence: never read, delete by hand)",
}
SET_ASIDE_NOTE = "the copy an interrupted overwrite set aside (restored on resume)"


_UNWRAPPED = 1 << 20
"""The width when output goes to a pipe or a file: lines and tables are never folded there
(a tensor name cut mid-word breaks grep and copy-paste); on a terminal its width applies."""


def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    width = None if probe.is_terminal else _UNWRAPPED
    return Console(stderr=stderr, highlight=False, emoji=False, width=width)


def stdout_console() -> Console:
    return _console()


def _err() -> Console:
    return _console(stderr=True)


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


def error(message: str) -> None:
    _err().print(Text(f"Error: {message}", style="bold red"), soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Report ``message`` on stderr and leave with ``code`` (2: usage or nothing found)."""
    error(message)
    raise click.exceptions.Exit(code)


_FLAGS = (("overwrite=True", "--overwrite"), ("key=...", "--key KEY"))
"""The library's advice names its Python arguments; a command spells them as these flags."""


def as_flags(message: str) -> str:
    """``message`` with the Python arguments it advises spelled as the commands' flags."""
    for argument, flag in _FLAGS:
        message = message.replace(argument, flag)
    return message


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn statekeeper and OS errors into one red line and an exit code, never a traceback."""
    try:
        yield
    except (StepNotFoundError, InvalidArgumentError) as exc:
        fail(as_flags(str(exc)), 2)
    except StatekeeperError as exc:
        fail(as_flags(str(exc)), 1)
    except OSError as exc:
        fail(f"{exc}; check that the path exists and is readable", 1)


def metrics_text(metrics: Mapping[str, Any]) -> str:
    parts = []
    for key, value in sorted(metrics.items()):
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        parts.append(f"{key}={shown}")
    return ", ".join(parts)


def _created(created: datetime | None) -> str:
    return created.strftime("%Y-%m-%d %H:%M:%S %Z").strip() if created else "unknown"


def listing(
    directory: str,
    infos: list[CheckpointInfo],
    partial: list[ParsedEntry],
    tiers: dict[int, list[str]] | None = None,
) -> None:
    console = stdout_console()
    if not infos and not partial:
        console.print(Text(f"{directory}: no checkpoints"), soft_wrap=True)
        return
    table = Table(title=Text(directory), title_justify="left")
    table.add_column("step", justify="right")
    table.add_column("created")
    table.add_column("size", justify="right")
    table.add_column("written", justify="right")
    table.add_column("files", justify="right")
    table.add_column("metrics", overflow="fold")
    if tiers is not None:
        table.add_column("tiers")
    table.add_column("status", overflow="fold")

    def where(step: int) -> tuple[str, ...]:
        return () if tiers is None else ("+".join(tiers.get(step, [])) or "-",)

    for info in infos:
        if info.error is not None:
            status = Text(f"damaged: {info.error}", style="red")
            table.add_row(str(info.step), "-", "-", "-", "-", "", *where(info.step), status)
            continue
        aside = ".replaced-" in info.path.rstrip("/").rpartition("/")[2]
        table.add_row(
            str(info.step),
            _created(info.created),
            human_bytes(info.bytes),
            human_bytes(info.written) if info.reused_files else "all",
            str(info.files),
            metrics_text(info.metrics),
            *where(info.step),
            Text(f"ok: {SET_ASIDE_NOTE}" if aside else "ok", style="green"),
        )
    for entry in partial:
        note = Text(f"{_NOTES.get(str(entry.kind), PARTIAL_NOTE)}: {entry.name}", style="yellow")
        table.add_row(str(entry.step), "-", "-", "-", "-", "", *where(-1), note)
    console.print(table)
    damaged = sum(1 for i in infos if i.error is not None)
    summary = f"{len(infos)} committed step(s)"
    if damaged:
        summary += f", {damaged} damaged"
    kept = sum(1 for p in partial if str(p.kind) == "damaged")
    if len(partial) > kept:
        summary += f", {len(partial) - kept} partial (remove with statekeeper.audit.remove_partial)"
    if kept:
        summary += f", {kept} damaged set aside (kept as evidence)"
    console.print(Text(summary), soft_wrap=True)


class ByteProgress:
    """A transient progress bar over bytes (or counts) on stderr; does nothing when disabled."""

    def __init__(self, enabled: bool, *, counts: bool = False) -> None:
        console = _err()
        self._progress: Progress | None = None
        if enabled and console.is_terminal:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn() if counts else DownloadColumn(binary_units=True),
                *(() if counts else (TransferSpeedColumn(),)),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )

    def __enter__(self) -> ByteProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def phase(self, description: str, total: int | None = None) -> ProgressCallback | None:
        """A callback for ``progress(done, total)`` shown as a new bar labelled ``description``."""
        progress = self._progress
        if progress is None:
            return None
        task = progress.add_task(description, total=total)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return update


def averaged(summary: Mapping[str, Any]) -> None:
    """``statekeeper average``: each input with its weight, then what was written."""
    for path, weight in zip(summary["inputs"], summary["weights"], strict=True):
        stdout_console().print(Text(f"{weight:.4f}  {path}"), soft_wrap=True)
    line = (
        f"averaged {len(summary['inputs'])} checkpoint(s), {summary['tensors']} tensor(s) -> "
        f"step {summary['step']}  {human_bytes(summary['bytes'])}  {summary['out']}"
    )
    stdout_console().print(Text(line, style="bold green"), soft_wrap=True)


def verify_step(result: StepVerifyReport) -> None:
    label = f"step {result.step if result.step is not None else '?'}"
    if result.ok:
        line = Text(f"OK      {label}  {human_bytes(result.bytes)}  {result.path}", style="green")
    else:
        line = Text(f"FAILED  {label}  {result.error}", style="red")
    stdout_console().print(line, soft_wrap=True)


def verify_summary(report: VerifyReport) -> None:
    results = report.steps
    failed = len(report.failed)
    total = sum(r.bytes for r in results if r.ok)
    if failed:
        text = Text(f"{failed} of {len(results)} step(s) failed verification", style="bold red")
    else:
        text = Text(
            f"all {len(results)} step(s) verified ({human_bytes(total)} checked)",
            style="bold green",
        )
    stdout_console().print(text, soft_wrap=True)
