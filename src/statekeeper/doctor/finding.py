"""What a rule reports, and the report of a whole diagnosis."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["Finding", "Report", "Severity"]


class Severity(StrEnum):
    ERROR = "error"  # a resumed run will not be faithful, or loading will fail
    WARNING = "warning"  # faithful, but wasteful or fragile
    INFO = "info"  # worth knowing; statekeeper handles it


@dataclass(frozen=True)
class Finding:
    """One hazard: which rule, where (module path or state entry), the tensor, what, the fix."""

    rule: str
    severity: Severity
    where: str
    problem: str
    fix: str
    tensor: str = ""
    shape: tuple[int, ...] | None = None
    bytes: int | None = None
    module: str | None = None  # the module's path ("" the root), where ``where`` names one

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.module is None:
            del data["module"]
        data["severity"] = str(self.severity)
        data["shape"] = None if self.shape is None else list(self.shape)
        return data


@dataclass(frozen=True)
class Report:
    """Every finding of one diagnosis, the rules skipped (with why), and how long it took."""

    target: str
    findings: tuple[Finding, ...]
    rules: tuple[tuple[str, str], ...]
    skipped: tuple[tuple[str, str], ...] = ()
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 clean (or info only), 1 warnings only, 2 errors."""
        severities = {f.severity for f in self.findings}
        return 2 if Severity.ERROR in severities else 1 if Severity.WARNING in severities else 0

    def by_severity(self, severity: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity is severity]

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "rules": [{"id": i, "summary": s} for i, s in self.rules],
            "skipped": [{"id": i, "reason": r} for i, r in self.skipped],
            "findings": [f.to_json() for f in self.findings],
        }
