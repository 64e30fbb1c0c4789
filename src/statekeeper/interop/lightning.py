"""Lightning ``.ckpt`` files: a ``torch.save`` dict with the module's weights under
``state_dict``, beside ``optimizer_states``, ``lr_schedulers``, ``loops``, ``callbacks``,
``epoch``, ``global_step`` and ``pytorch-lightning_version``. Read with weights_only like any
``torch.save`` file: a checkpoint whose ``hyper_parameters`` hold objects (an
``AttributeDict``, a config class) is refused, listing them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from statekeeper.errors import CorruptCheckpointError
from statekeeper.interop.pickled import load_torch_file

__all__ = ["WEIGHTS_KEY", "is_lightning", "read_lightning"]

WEIGHTS_KEY = "state_dict"
_MARKERS = ("pytorch-lightning_version", "optimizer_states", "lr_schedulers", "loops")


def is_lightning(state: object) -> bool:
    """Whether a loaded object is a Lightning checkpoint dict."""
    return (
        isinstance(state, Mapping)
        and isinstance(state.get(WEIGHTS_KEY), Mapping)
        and any(m in state for m in _MARKERS)
    )


def read_lightning(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict; a ``.ckpt`` that is not a dict is a CorruptCheckpointError."""
    state = load_torch_file(path)
    if not isinstance(state, dict):
        raise CorruptCheckpointError(
            str(path), f"a .ckpt holding a {type(state).__name__}, not a Lightning dict"
        )
    return state
