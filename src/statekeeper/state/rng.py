"""Every random number generator a run draws from, as one Stateful.

Captured: Python's ``random``, numpy's global ``RandomState``, torch's CPU generator, the
generator of every CUDA device (when CUDA is initialized), and the ``torch.Generator`` /
``numpy.random.Generator`` objects registered by name. ``save`` calls this object's
``state_dict()`` before any other entry's (a ``state_dict()`` that draws random numbers must
not change the run) and ``load`` restores it after every other entry.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from statekeeper.arguments import require_mapping
from statekeeper.errors import InvalidArgumentTypeError, KeyMismatchError

__all__ = ["RNGState"]

Generator = torch.Generator | np.random.Generator


def _cuda_in_use() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


class RNGState:
    """The state of all global generators plus the ``generators`` registered by name.

    Args:
        generators: Extra ``torch.Generator`` / ``numpy.random.Generator`` objects, by name.
    """

    def __init__(self, generators: Mapping[str, Generator] | None = None) -> None:
        require_mapping(
            "generators", generators, "names to generators, e.g. {'data': g}", optional=True
        )
        self.generators = dict(generators or {})
        for name, gen in self.generators.items():
            if not isinstance(name, str) or not name:
                raise InvalidArgumentTypeError(
                    f"generators: the name {name!r} is not a non-empty str; name each "
                    "generator, e.g. generators={'data': g}"
                )
            if not isinstance(gen, torch.Generator | np.random.Generator):
                raise InvalidArgumentTypeError(
                    f"generator {name!r} is a {type(gen).__name__}; register torch.Generator "
                    "or numpy.random.Generator objects, e.g. generators={'data': "
                    "torch.Generator().manual_seed(0)}"
                )

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if _cuda_in_use() else [],
            "generators": {},
        }
        for name, gen in self.generators.items():
            if isinstance(gen, torch.Generator):
                state["generators"][name] = {"torch": gen.get_state(), "device": str(gen.device)}
            else:
                state["generators"][name] = {"numpy": gen.bit_generator.state}
        return state

    def mismatches(self, state: Mapping[str, Any], entry: str = "rng") -> list[str]:
        """Every way ``state`` does not fit the registered generators (empty when it fits).

        Args:
            state: A saved RNG state, as ``state_dict`` returned it.
            entry: The entry's name, for the messages.

        Returns:
            One message per mismatch.
        """
        if not isinstance(state, Mapping) or not {"python", "numpy", "torch"} <= set(state):
            return [f"{entry}: checkpoint holds no RNG state"]
        saved = dict(state.get("generators", {}))
        problems = [
            f"{entry}/generators/{n}: missing from the checkpoint"
            for n in self.generators
            if n not in saved
        ]
        problems += [
            f"{entry}/generators/{n}: in the checkpoint but not registered"
            for n in saved
            if n not in self.generators
        ]
        cuda = list(state.get("cuda", []))
        if cuda and torch.cuda.is_available() and len(cuda) != torch.cuda.device_count():
            problems.append(
                f"{entry}/cuda: {len(cuda)} CUDA generator state(s) saved, "
                f"{torch.cuda.device_count()} device(s) here"
            )
        return problems

    def load_state_dict(self, state: Mapping[str, Any], /) -> None:
        problems = self.mismatches(state)
        if problems:
            raise KeyMismatchError(
                problems, "Register the same generators, by name, as the run that saved."
            )
        saved = dict(state.get("generators", {}))
        cuda = list(state.get("cuda", []))
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda)
        for name, gen in self.generators.items():
            entry = saved[name]
            if isinstance(gen, torch.Generator):
                gen.set_state(entry["torch"])
            else:
                gen.bit_generator.state = entry["numpy"]
