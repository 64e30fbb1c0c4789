"""The ``Stateful`` protocol and an adapter for plain values.

Anything with ``state_dict()`` and ``load_state_dict(state)`` is ``Stateful``: modules,
optimizers, LR schedulers, ``GradScaler``, torchdata's ``StatefulDataLoader`` need no
wrapper. Plain values (numbers, strings, dicts of them, tensors) can be put in the state
directly; wrap one in :class:`Value` when it must be restored in place.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

__all__ = ["Stateful", "Value", "is_stateful"]

T = TypeVar("T")


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> Any:
        """The object's state, to be saved.

        Returns:
            Nested dicts, lists and tuples of tensors and plain values (no live objects).
        """
        ...

    def load_state_dict(self, state_dict: Any, /) -> Any:
        """Restore the object in place from what ``state_dict`` returned.

        Args:
            state_dict: The state as saved.

        Returns:
            Whatever the method returns (most return None, a torch module its missing and
            unexpected keys); statekeeper does not use it.
        """
        ...


def is_stateful(obj: object) -> bool:
    """Whether ``obj`` has callable ``state_dict`` and ``load_state_dict``."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


class Value(Generic[T]):
    """A mutable box for a plain value: ``counter = Value(0)``; ``counter.value += 1``.

    Args:
        value: The initial value (a plain, JSON-able value).
    """

    def __init__(self, value: T) -> None:
        self.value = value

    def state_dict(self) -> dict[str, T]:
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, T], /) -> None:
        self.value = state_dict["value"]

    def __repr__(self) -> str:
        return f"Value({self.value!r})"
