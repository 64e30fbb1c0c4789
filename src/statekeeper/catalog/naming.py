"""Entry names in a run directory: ``step_000001200`` (committed); ``.partial-<id>`` and
``.removing-<id>`` (not committed: never read, cleaned up); ``.replaced-<id>`` (a copy an
overwrite set aside: the committed copy while ``step_N`` does not exist, else superseded and
cleaned up); ``.damaged-<id>`` (a damaged step a restarted run saved again: never read,
kept as evidence)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["EntryKind", "ParsedEntry", "parse_entry", "step_entry"]

_PATTERN = re.compile(r"step_(\d+)(?:\.(partial|replaced|removing|damaged)-([0-9a-f]+))?")


class EntryKind(StrEnum):
    """What an entry of a run directory is, from its name."""

    COMMITTED = "committed"
    PARTIAL = "partial"
    REPLACED = "replaced"
    REMOVING = "removing"  # being deleted (retention): never read, cleaned up like a partial
    DAMAGED = "damaged"  # set aside by a restarted run that saved the step again: evidence


@dataclass(frozen=True)
class ParsedEntry:
    """One entry of a run directory, as its name tells: the entry's ``name``
    (``step_000000300.partial-1f2e...``), the ``step`` it belongs to and its ``kind``."""

    name: str
    step: int
    kind: EntryKind


def step_entry(step: int) -> str:
    """``1200`` -> ``"step_000001200"`` (zero-padded to 9 digits, more when needed)."""
    return f"step_{step:09d}"


def parse_entry(name: str) -> ParsedEntry | None:
    """What an entry name means, or None for names statekeeper does not own."""
    match = _PATTERN.fullmatch(name)
    if match is None:
        return None
    kind = EntryKind(match.group(2)) if match.group(2) else EntryKind.COMMITTED
    return ParsedEntry(name, int(match.group(1)), kind)
