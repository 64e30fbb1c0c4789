"""What a rule reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

__all__ = ["Finding", "Severity"]


class Severity(StrEnum):
    ERROR = "error"  # a resumed run will not be faithful
    WARNING = "warning"  # faithful, but wasteful or fragile


@dataclass(frozen=True)
class Finding:
    """One hazard: which rule, where (state entry / module path), what is wrong, the fix."""

    rule: str
    severity: Severity
    where: str
    problem: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}
