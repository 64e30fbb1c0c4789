"""Keys that one side omits because they are tied: ``diff``'s ``tied=`` option.

Hugging Face folders (``save_pretrained``) and safetensors files written by
``transformers`` store tied weights once: a GPT-2 folder has ``transformer.wte.weight`` but
no ``lm_head.weight``, while ``torch.save(model.state_dict())`` of the same model holds both,
sharing memory. Compared naively, the folder "differs" by one missing key. With ties
matched, a key present on one side only, whose tensor there is the very same view as a key
both sides hold (same memory, shape, strides and dtype: tied as
:func:`statekeeper.format.aliases.view_key` says), counts as omitted because tied: it is
left out of the comparison (its twin is compared) and named in a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import torch

from statekeeper.format.aliases import view_key

__all__ = ["TiedKeys", "drop_tied"]


class TiedKeys(StrEnum):
    """How ``diff`` treats a key one side omits because it is tied to another.

    - ``AUTO`` (default): ``MATCH`` when either side is a Hugging Face folder or a
      safetensors file (formats that store tied weights once), else ``STRICT``;
    - ``MATCH``: such a key is equal when its twin is (named in a note);
    - ``STRICT``: every key must be on both sides.
    """

    AUTO = "auto"
    MATCH = "match"
    STRICT = "strict"


def _view(value: Any) -> tuple[Any, ...] | None:
    return view_key(value) if isinstance(value, torch.Tensor) else None


def _twins(flat: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, str]:
    """Keys of ``flat`` that ``other`` lacks, mapped to a key both hold with the same view."""
    shared: dict[tuple[Any, ...], str] = {}
    for key, value in flat.items():
        view = _view(value) if key in other else None
        if view is not None:
            shared.setdefault(view, key)
    found = {}
    for key, value in flat.items():
        view = _view(value) if key not in other else None
        if view is not None and view in shared:
            found[key] = shared[view]
    return found


def drop_tied(
    a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """``a`` and ``b`` without the keys one side omits because they are tied, and notes."""
    notes = []
    out = []
    for flat, other, (mine, theirs) in ((a, b, names), (b, a, names[::-1])):
        twins = _twins(flat, other)
        for key, twin in sorted(twins.items()):
            notes.append(
                f"{key}: only in {mine}, where it is tied to {twin}; {theirs} stores the tie "
                "once (compared through its twin)"
            )
        out.append({k: v for k, v in flat.items() if k not in twins})
    return out[0], out[1], notes
