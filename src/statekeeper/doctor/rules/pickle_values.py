"""SK008: state_dict values that cannot be stored without pickle.

A dry run of statekeeper's own codec (:func:`statekeeper.state.tree.flatten`) over the
model's ``state_dict()`` and, when there is one, the optimizer's. Entries are encoded one by
one, and a failing container is searched child by child, so every offending key path is
reported, not only the first: objects (typically from ``get_extra_state``) and tensors of a
dtype safetensors has no code for. Nothing is written anywhere.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import MODEL, DoctorRule
from statekeeper.doctor.rules._probe import module_path
from statekeeper.errors import UnsupportedValueError
from statekeeper.format.values import join_path
from statekeeper.state.tree import flatten

__all__ = ["PickleValues", "offenders"]


def _children(value: object) -> Iterable[tuple[Any, Any]] | None:
    if type(value) is dict or isinstance(value, OrderedDict):
        return list(value.items())
    if type(value) is list or type(value) is tuple:
        return list(enumerate(value))
    return None


def offenders(
    items: Iterable[tuple[Any, Any]], root: str = ""
) -> Iterator[tuple[str, object, UnsupportedValueError]]:
    """``(key path, offending value or None, error)`` for every value the codec refuses."""
    for key, value in items:
        try:
            flatten({key: value}, root)
        except UnsupportedValueError as exc:
            path = join_path(root, key)
            children = None if exc.key_path == path else _children(value)
            found = list(offenders(children, path)) if children is not None else []
            if found:
                yield from found
            else:
                yield exc.key_path, value if exc.key_path == path else None, exc


def _type_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


class PickleValues(DoctorRule, id="SK008", severity=Severity.ERROR, needs=MODEL):
    summary = "state_dict values that cannot be stored without pickle"

    def check(self, target: Target) -> Iterator[Finding]:
        yield from self._entry("", target.require_model().state_dict(), is_model=True)
        if target.optimizer is not None:
            name = next((k for k, v in target.state.items() if v is target.optimizer), "optimizer")
            yield from self._entry(name, target.optimizer.state_dict(), is_model=False)

    def _entry(self, root: str, state: dict[str, Any], *, is_model: bool) -> Iterator[Finding]:
        for path, value, exc in offenders(state.items(), root):
            key = path.split("/", 1)[0]
            where = module_path(key, "<root>") if is_model else root
            tensor = path if is_model else path.removeprefix(f"{root}/")
            if isinstance(value, torch.Tensor | np.ndarray):
                dtype = str(value.dtype).removeprefix("torch.")
                yield Finding(
                    self.id, Severity.ERROR, where,
                    f"a tensor of dtype {dtype}, which safetensors cannot store",
                    "convert it in state_dict() to a supported dtype (or .view() it as uint8 "
                    "and store the dtype's name beside it), and back in load_state_dict()",
                    tensor=tensor, shape=tuple(value.shape),
                    bytes=int(value.nbytes),
                )  # fmt: skip
                continue
            kind = _type_name(exc.value_type)
            source = " (returned by get_extra_state())" if "_extra_state" in path else ""
            yield Finding(
                self.id, Severity.ERROR, where,
                f"holds a value of type {kind}{source}, which cannot be stored without pickle "
                "(torch.save pickles it; loading such a file runs code)",
                "return only tensors, numbers, strings, bytes, lists, tuples and dicts "
                "(from get_extra_state(), or the object's state_dict()), and rebuild the "
                "object from them in set_extra_state() / load_state_dict()",
                tensor=tensor,
            )  # fmt: skip
