"""The doctor's output: its findings, and the declarations ``--fix-transient`` proposes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from statekeeper.cli.render import human_bytes, stdout_console
from statekeeper.cli.render_json import emit_json

if TYPE_CHECKING:
    from statekeeper.doctor.finding import Report as DoctorReport
    from statekeeper.doctor.transient_fix import TransientFix

__all__ = ["doctor_report", "transient_fix"]


def doctor_report(report: DoctorReport, as_json: bool) -> None:
    """The doctor's findings grouped by severity, each with its fix; or JSON. User text (the
    target's name, problems, tensor names) is printed as text, never as markup or emoji."""
    if as_json:
        emit_json(report.to_json())
        return
    out = stdout_console()
    head = Text("statekeeper doctor", style="bold")
    head.append(f" {report.target}: {len(report.rules)} rules, {report.seconds:.1f} s", style="")
    out.print(head, soft_wrap=True)
    from statekeeper.doctor.finding import Severity  # the doctor (and torch) only here

    colors = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
    for severity, color in colors.items():
        for f in report.by_severity(severity):
            what = f" {f.tensor}" if f.tensor else ""
            size = f" {tuple(f.shape)}" if f.shape is not None else ""
            size += f" {human_bytes(f.bytes)}" if f.bytes is not None else ""
            line = Text(f"{f.rule} {severity}", style=color)
            line.append(f" {f.where}{what}", style="bold")
            line.append(size)
            out.print(line, soft_wrap=True)
            out.print(Text(f"  {f.problem}"), soft_wrap=True)
            out.print(Text(f"  fix: {f.fix}"), soft_wrap=True)
    for rule, reason in report.skipped:
        out.print(Text(f"{rule} skipped: {reason}", style="dim"), soft_wrap=True)
    counts = ", ".join(f"{len(report.by_severity(s))} {s}" for s in colors)
    summary = "clean" if not report.findings else counts
    if report.skipped:
        summary += f" ({len(report.skipped)} of {len(report.rules)} rules skipped: see above)"
    out.print(Text(summary), soft_wrap=True)


def transient_fix(fix: TransientFix, as_json: bool) -> None:
    """The code to add (class by class) and the call to make; or JSON. Plain text only:
    it is meant to be copied into the user's source."""
    if as_json:
        emit_json(fix.to_json())
        return
    out = stdout_console()
    code = fix.code()
    if code:
        out.print(Text(f"# statekeeper doctor --fix-transient {fix.target}: add to your classes"),
                  soft_wrap=True)  # fmt: skip
        out.print(Text(code), soft_wrap=True)
        out.print(Text("\n# then, before saving or exporting the whole module:"), soft_wrap=True)
        out.print(Text(fix.call), soft_wrap=True)
    elif fix.classes:
        out.print(Text(f"{fix.target}: every transient tensor is declared; call {fix.call}"),
                  soft_wrap=True)  # fmt: skip
    elif fix.checked:
        out.print(Text(f"{fix.target}: no transient tensors or per-batch buffers found"),
                  soft_wrap=True)  # fmt: skip
    else:
        out.print(Text(f"{fix.target}: not checked (SK004 and SK005 need a fresh model "
                       "and an example input)", style="red"), soft_wrap=True)  # fmt: skip
    if fix.calibration:
        names = ", ".join(fix.calibration)
        note = f"# not proposed (filled or reshaped by use: the model's, not the batch's): {names}"
        out.print(Text(note, style="dim"), soft_wrap=True)
    for f in fix.report.findings:
        if f.tensor == "":  # the rule's own note: no fresh instance
            out.print(Text(f"{f.rule}: {f.problem}; {f.fix}", style="dim"), soft_wrap=True)
    for rule, reason in fix.report.skipped:
        out.print(Text(f"{rule} skipped: {reason}", style="dim"), soft_wrap=True)
