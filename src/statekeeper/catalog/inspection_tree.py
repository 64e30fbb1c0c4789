"""A step's state tree as :mod:`statekeeper.catalog.inspection` reports it: decoded from
the manifest with tensors left as references, walked into tensor references and plain
leaves, and long values summarized. No tensor is built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.malformed import FormatError, corrupt
from statekeeper.format.manifest import Manifest
from statekeeper.format.values import join_path
from statekeeper.format.values_decode import decode_value

__all__ = ["SHORT_VALUE", "Ref", "decode", "relative", "summary", "walk"]

SHORT_VALUE = 60
"""Values whose ``repr`` is at most this long are shown; longer ones are summarized."""


@dataclass(frozen=True)
class _Ref:
    """A tensor of the state: its tag (``$tensor``, ``$ndarray``, ...) and manifest name.

    The class keeps the name ``_Ref``: an entry that is a single tensor reports its type as
    this class's name, and that text is part of ``statekeeper inspect --json``'s output."""

    tag: str
    name: str


Ref = _Ref


def summary(value: Any) -> tuple[str, bool]:
    """``(shown, complete)``: the value's repr when short, else a summary of it."""
    text = repr(value)
    if len(text) <= SHORT_VALUE:
        return text, True
    if isinstance(value, str):
        return f"<str of {len(value)} characters>", False
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>", False
    if isinstance(value, list | tuple):
        kinds = sorted({type(v).__name__ for v in value})
        return f"<{type(value).__name__} of {len(value)} {'/'.join(kinds)}>", False
    return text[: SHORT_VALUE - 3] + "...", False


def _is_container(value: Any) -> bool:
    return isinstance(value, Mapping) or type(value) in (list, tuple)


def walk(value: Any, path: str, refs: list[tuple[str, Ref]], leaves: list[tuple[str, Any]]) -> None:
    """Collect tensor references and non-tensor leaves in traversal order.

    A list or tuple of plain values (no containers, no tensors) counts as one leaf.
    """
    if isinstance(value, Ref):
        refs.append((path, value))
    elif isinstance(value, Mapping) and value:
        for key, child in value.items():
            walk(child, join_path(path, key), refs, leaves)
    elif type(value) in (list, tuple) and any(
        _is_container(v) or isinstance(v, Ref) for v in value
    ):
        for i, child in enumerate(value):
            walk(child, join_path(path, i), refs, leaves)
    else:
        leaves.append((path, value))


def relative(path: str, entry: str) -> str:
    """``path`` inside the top-level ``entry`` ("" for the entry itself)."""
    return path[len(entry) + 1 :] if path.startswith(entry + "/") else ""


def decode(manifest: Manifest, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state (tensors as :class:`Ref`) and metrics; the per-rank entries of a sharded
    step appear as ``"<entry> (rank <r>)"``. A malformed state or metric is a
    ``CorruptCheckpointError`` naming ``where``."""

    def on_ref(tag: str, name: str) -> Ref:
        return Ref(tag, name)

    def no_ref(tag: str, name: str) -> Ref:
        raise FormatError(f"metrics cannot refer to tensor {name!r}", key=name)

    skeletons: list[tuple[int | None, Any]] = [(None, manifest.state)]
    if manifest.sharding is not None:
        skeletons += list(enumerate(manifest.sharding.ranks))
    state: dict[str, Any] = {}
    try:
        for rank, skeleton in skeletons:
            part = decode_value(skeleton, "", on_ref)
            if not isinstance(part, dict):
                raise CorruptCheckpointError(where, "state is not a mapping")
            suffix = "" if rank is None else f" (rank {rank})"
            state.update({f"{k}{suffix}": v for k, v in part.items()})
    except FormatError as exc:
        raise corrupt(where, exc, "state is malformed: {}") from exc
    try:
        metrics = {k: decode_value(v, k, no_ref) for k, v in manifest.metrics.items()}
    except FormatError as exc:
        raise corrupt(where, exc, "metrics are malformed: {}") from exc
    return state, metrics
