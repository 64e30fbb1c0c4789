"""The options of :func:`statekeeper.clearing.clear_state` and the report of what it cleared."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["ClearAction", "ClearInclude", "ClearMode", "ClearReport", "Cleared"]


class ClearMode(StrEnum):
    """How tensors are freed."""

    EMPTY = "empty"  # the module's own tensors emptied in place, the rest dropped
    RELEASE = "release"  # references dropped only: memory goes unless held elsewhere


class ClearInclude(StrEnum):
    """What is cleared besides transient attributes."""

    TRANSIENT = "transient"  # transient attributes only
    BATCH_STATE = "batch_state"  # and persistent buffers holding per-batch state (SK005)


class ClearAction(StrEnum):
    """What happened to one attribute or buffer."""

    EMPTIED = "emptied"  # its tensors emptied in place, then the attribute reset
    RELEASED = "released"  # the attribute reset: its tensors go unless held elsewhere
    RESET = "reset"  # a per-batch buffer put back to its initial value, in place
    CUSTOM = "custom"  # the module's own method or a registered rule ran


@dataclass(frozen=True)
class Cleared:
    """One attribute or buffer (``module.path.name``), or a module (``CUSTOM``), cleared;
    ``bytes`` is the tensor data it held (each tensor counted once per call).

    Attributes:
        path: The attribute or buffer (``module.path.name``), or the module.
        action: The :class:`ClearAction` taken.
        bytes: The tensor data it held.
    """

    path: str
    action: ClearAction
    bytes: int


@dataclass
class ClearReport:
    """What a ``clear_state`` call cleared; pass one as ``report=`` to have it filled.

    Attributes:
        cleared: One :class:`Cleared` per attribute, buffer or module cleared.
    """

    cleared: list[Cleared] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Tensor bytes the cleared attributes and buffers held."""
        return sum(c.bytes for c in self.cleared)
