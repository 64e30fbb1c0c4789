"""Which attributes a forward leaves holding the module's own *input*: an identity-like
module's cache, a cell that keeps the state it was given. ``doctor --fix-transient``
proposes ``statekeeper_borrowed`` for them, so ``clear_state`` drops them by reference and
never empties the caller's tensor."""

from __future__ import annotations

from typing import Any

import torch

from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._probe import fresh_model, isolated_rng, kept_modes
from statekeeper.state.attributes import held_tensors, plain_attributes

__all__ = ["kept_inputs"]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return held_tensors(value) or []


def kept_inputs(target: Target) -> set[tuple[str, str]]:
    """(module path, attribute) of every attribute that, after one eval-mode forward of a
    fresh instance under ``no_grad``, holds only tensors the module was called with. Empty
    when no fresh instance can be built or the forward fails (the rules report those)."""
    inputs: dict[int, list[torch.Tensor]] = {}  # tensors held, so that ids stay unique

    def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        got = inputs.setdefault(id(module), [])
        for value in (*args, *kwargs.values()):
            got.extend(_tensors(value))

    handles: list[Any] = []
    with isolated_rng():
        try:
            built = fresh_model(target)
            if built is None:
                return set()
            fresh, model = built
            for m in model.modules():
                if not isinstance(m, torch.jit.ScriptModule):  # hooks are refused there
                    handles.append(m.register_forward_pre_hook(record, with_kwargs=True))
            with kept_modes(model), torch.no_grad():
                fresh.call(model.eval())
        except Exception:  # a forward or a build that fails is the rules' to report
            return set()
        finally:
            for handle in handles:
                handle.remove()
    owners = {path: id(m) for path, m in model.named_modules()}
    kept = set()
    for path, attr, value in plain_attributes(model):
        given = {id(t) for t in inputs.get(owners[path], [])}
        tensors = _tensors(value)
        if tensors and all(id(t) in given for t in tensors):
            kept.add((path, attr))
    return kept
