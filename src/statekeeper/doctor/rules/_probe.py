"""What the rules that probe a model share: isolated RNGs, modes kept, fresh instances, and
the tensors a model holds (its persistent buffers, its plain attributes, their sizes)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.state.attributes import plain_attributes

__all__ = [
    "fresh_model",
    "isolated_rng",
    "kept_modes",
    "module_path",
    "nbytes",
    "not_fresh",
    "persistent_buffers",
    "plain_attributes",
    "seed_all",
    "state_ids",
]


@contextmanager
def isolated_rng() -> Iterator[None]:
    """Every global generator (python, numpy, torch CPU and initialized CUDA) restored on exit."""
    cuda = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    devices = list(range(torch.cuda.device_count())) if cuda else []
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def seed_all(seed: int) -> None:
    """Seed every global generator (CUDA's only once initialized: no lazily queued seeding)."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.manual_seed_all(seed)
    random.seed(seed)
    np.random.seed(seed)


@contextmanager
def kept_modes(model: torch.nn.Module) -> Iterator[None]:
    """The train/eval mode of every module of ``model`` restored on exit."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def fresh_model(target: Target) -> tuple[Target, torch.nn.Module] | None:
    """A target built anew by the factory with its model, or None when the factory built no
    model or returned the target's own (report :func:`not_fresh` then)."""
    fresh = target.fresh()
    model = fresh.model
    if model is None or model is target.model:
        return None
    return fresh, model


def not_fresh(rule: str) -> Finding:
    """The finding of a rule that needs a new instance when the factory returned the same one."""
    return Finding(
        rule, Severity.INFO, "model",
        "skipped: the factory did not build new, independent model instances",
        "make the factory return a new model on every call",
    )  # fmt: skip


def module_path(key: str, root: str = "model") -> str:
    """The module of a tensor or state_dict key: ``"block.0.weight"`` -> ``"block.0"``; a
    tensor of the root module -> ``root`` (``"<root>"`` in the findings of SK007 to SK009)."""
    return key.rpartition(".")[0] or root


def state_ids(model: torch.nn.Module) -> set[int]:
    """The ids of ``model``'s parameters and buffers: the tensors its state_dict captures."""
    return {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}


def persistent_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every buffer the state_dict holds, the live tensor by its key (a buffer registered on
    two modules under both keys)."""
    buffers = {id(b) for b in model.buffers()}
    return {
        key: value
        for key, value in model.state_dict(keep_vars=True).items()
        if isinstance(value, torch.Tensor) and id(value) in buffers
    }


def nbytes(t: torch.Tensor) -> int:
    """The bytes of ``t``'s elements (0 for exotic subclasses that cannot say)."""
    try:
        return t.numel() * t.element_size()
    except (RuntimeError, NotImplementedError):
        return 0
