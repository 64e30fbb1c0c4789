"""What a round trip keeps beyond a state's value, which ``statekeeper.testing``'s comparison
(order-free for mappings, by design) does not look at: the key order of every mapping, and
an ``OrderedDict``'s ``_metadata`` (``torch.nn.Module.state_dict()`` sets it)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from statekeeper.testing import assert_state_equal

__all__ = ["assert_same_in_order", "key_orders"]


def key_orders(value: Any, path: str = "") -> Iterator[tuple[str, list[Any], Any]]:
    """``(path, keys in order, _metadata or None)`` for every mapping inside ``value``."""
    if isinstance(value, Mapping):
        yield path, list(value), getattr(value, "_metadata", None)
        for key, child in value.items():
            yield from key_orders(child, f"{path}/{key}")
    elif isinstance(value, list | tuple):
        for i, child in enumerate(value):
            yield from key_orders(child, f"{path}/{i}")


def assert_same_in_order(actual: Any, expected: Any) -> None:
    """``statekeeper.testing.assert_state_equal``, and the same key orders and metadata."""
    assert_state_equal(actual, expected)
    orders = list(key_orders(actual)), list(key_orders(expected))
    assert orders[0] == orders[1], f"key order or metadata differs: {orders[0]} != {orders[1]}"
