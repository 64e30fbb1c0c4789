"""What the save and the retention policies share: ``a | b`` composing two policies of one
family into that family's union, and a policy of one positive count ``n``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from statekeeper.errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["Composable", "PositiveN", "parts", "positive_int"]


def positive_int(name: str, value: object) -> None:
    if type(value) is not int:  # a bool, a float or a str is the wrong type, not a bad value
        raise InvalidArgumentTypeError(
            f"{name} must be a positive int, got {type(value).__name__} {value!r}; pass e.g. 10"
        )
    if value < 1:
        raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class PositiveN:
    """A policy of one positive int ``n``, checked on construction."""

    n: int

    def __post_init__(self) -> None:
        positive_int(f"{type(self).__name__}(n)", self.n)


P = TypeVar("P", bound="Composable[Any]")


class Composable(Generic[P]):
    """``a | b`` of one family of policies (``P``: the save policies, or the retention
    policies): the family's union policy of both sides' parts, nested unions flattened."""

    _family: ClassVar[type[Any]]
    """The family's base class (set on it by ``__init_subclass__``)."""
    _union: ClassVar[type[Any]]
    """The family's union policy (``AnySave``, ``KeepAny``), set once it is defined."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if Composable in cls.__bases__:  # the base of a family: SavePolicy, Retention
            cls._family = cls

    def __or__(self, other: P) -> P:
        if not isinstance(other, self._family):
            return NotImplemented
        union: P = self._union((*parts(self), *parts(other)))
        return union


def parts(policy: Composable[Any]) -> tuple[Any, ...]:
    """The policies a union holds; any other policy alone."""
    return policy.policies if isinstance(policy, policy._union) else (policy,)
