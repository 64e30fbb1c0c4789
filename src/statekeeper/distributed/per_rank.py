"""Entries that differ between the ranks of a job: :class:`PerRank`."""

from __future__ import annotations

from typing import Any

from statekeeper.errors import InvalidArgumentError
from statekeeper.stateful import is_stateful

__all__ = ["PerRank"]


class PerRank:
    """Marks a Stateful entry as this rank's own: saved and restored per rank.

    RNG states and data loaders are per rank already; wrap anything else that differs
    between ranks (a custom sampler, a per-rank counter object). Every other entry that is
    not a module or optimizer is taken as replicated and saved from rank 0.

    Args:
        obj: The Stateful object that differs from rank to rank.
    """

    def __init__(self, obj: Any) -> None:
        if not is_stateful(obj):
            raise InvalidArgumentError(
                f"PerRank wraps objects with state_dict()/load_state_dict(), got "
                f"{type(obj).__name__}"
            )
        self.obj = obj

    def state_dict(self) -> Any:
        return self.obj.state_dict()

    def load_state_dict(self, state: Any) -> Any:
        """Restore the wrapped object in place from this rank's saved state.

        Args:
            state: This rank's state, as the wrapped object's ``state_dict`` returned it.

        Returns:
            What the wrapped object's ``load_state_dict`` returns (a torch module: its
            missing and unexpected keys).
        """
        return self.obj.load_state_dict(state)

    def __repr__(self) -> str:
        return f"PerRank({self.obj!r})"
