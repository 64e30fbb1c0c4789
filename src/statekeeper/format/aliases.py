"""Tensors that share storage are stored once and recorded as views of what is stored.

Tensors are grouped by the storage they live in. A group of one is stored as its values
(a self-overlapping ``expand``/``meshgrid`` tensor is materialized). In a larger group:

- members that are the same view (tied weights) are stored once; the others alias it;
- members that are different views of one storage (a tensor and its slice) alias a single
  stored *base*: a member that covers the whole used span contiguously if there is one,
  else the span itself, stored under ``"<first member>~storage"``.

Tied means the same view of the same memory: equal :func:`view_key`. This module is the one
tie detector: statekeeper's own saves (:func:`plan_sharing`), the safetensors files that
``convert`` and ``export`` write (:func:`tie_plan`) and ``diff``'s tied keys all use it.

An alias is ``{"base": stored name, "offset": o, "shape": [...], "stride": [...]}`` in
elements of the base, so ``torch.as_strided(base, shape, stride, offset)`` rebuilds it and
the rebuilt tensors share memory again. Members of one storage with different dtypes are
stored separately (no alias): a re-typed view cannot be rebuilt exactly by ``as_strided``.

A view may have more elements than its base (an ``expand``, stride 0, or another
self-overlapping view), but at most :data:`MAX_ALIAS_AMPLIFICATION` times as many: see
:func:`alias_problem`. A member beyond that is stored with its own values instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statekeeper.format.malformed import FormatError

if TYPE_CHECKING:
    import torch


__all__ = [
    "MAX_ALIAS_AMPLIFICATION",
    "Alias",
    "SharingPlan",
    "alias_problem",
    "plan_sharing",
    "rebuild_alias",
    "storage_key",
    "tie_plan",
    "view_key",
]

MAX_ALIAS_AMPLIFICATION = 64
"""An alias has at most this many times the elements of its stored base.

Every reader of a view pays for its logical elements, not for the stored ones: ``diff``
compares them, ``convert`` and ``export`` write them out materialized, a training step
reads them. Without a bound, one resealed manifest line (a stride-0 view of shape
``[2**20, 2**20]`` over a 1-element base passes every other check) costs 2**40 elements of
work and memory. Views that ``plan_sharing`` records for real state are tied weights
(ratio 1), slices, transposes and reshapes (at most 1), and the rare view that repeats its
memory (``expand`` of another entry, ``unfold`` windows): there the ratio is the repeat
count, commonly a batch, head or window count well under 64. So 64 keeps sharing for every
view a state dict commonly holds, while a crafted alias costs at most 64 elements of work
per element actually stored in its base (a stored element is at least one byte of a
checksummed file). The bound is on the ratio, not an absolute size, so that it grows with
what is really present; a view beyond it is stored with its own values by
:func:`plan_sharing` (it then loads as a tensor of its own: equal values, not shared).
"""

_INT64 = (1 << 63) - 1  # torch sizes, strides and offsets are int64


@dataclass(frozen=True)
class Alias:
    """One tensor recorded as a view of a stored tensor."""

    base: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "base": self.base,
            "offset": self.offset,
            "shape": list(self.shape),
            "stride": list(self.stride),
        }


@dataclass(frozen=True)
class SharingPlan:
    """``stored``: name -> tensor to write (traversal order); ``aliases``: name -> view."""

    stored: dict[str, torch.Tensor]
    aliases: dict[str, Alias]


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for dim in reversed(shape):
        stride.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(stride))


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last+1) element indices of ``t`` within its storage."""
    lo = int(t.storage_offset())
    return lo, lo + 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))


def storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    """The memory ``t`` lives in (device and storage address); None for a tensor that has
    none to share (no elements, or on the ``meta`` device)."""
    if t.numel() == 0 or t.device.type == "meta":
        return None
    return (str(t.device), t.untyped_storage().data_ptr())


def view_key(t: torch.Tensor) -> tuple[Any, ...] | None:
    """Equal for tensors that are tied: the same view (offset, shape, strides, dtype) of the
    same memory; None for a tensor that has no memory to share (see :func:`storage_key`)."""
    where = storage_key(t)
    if where is None:
        return None
    return (*where, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def tie_plan(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors to store (tied ones once, under the first name) and ``alias -> stored name``.

    Tied means the same view of the same memory (:func:`view_key`). Tensors that merely
    overlap (a slice of another) are each stored with their own values: a plain safetensors
    file has no views (statekeeper's own steps record them: :func:`plan_sharing`).
    """
    first: dict[tuple[Any, ...], str] = {}
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in tensors.items():
        key = view_key(t)
        if key is not None and key in first:
            aliases[name] = first[key]
        else:
            if key is not None:
                first[key] = name
            stored[name] = t
    return stored, aliases


def _tied(members: list[str], tensors: dict[str, torch.Tensor]) -> bool:
    """Whether ``members`` (of one storage and dtype) are all the same view."""
    return len({view_key(tensors[m]) for m in members}) == 1


def plan_sharing(tensors: dict[str, torch.Tensor]) -> SharingPlan:
    """Decide which tensors are written and which are re-created as views on load."""
    groups: dict[tuple[str, int], list[str]] = {}
    for name, t in tensors.items():
        key = storage_key(t)
        if key is not None:
            groups.setdefault(key, []).append(name)
    leader: dict[str, list[str]] = {}
    alone: set[str] = set()  # views beyond the bound: stored with their own values
    for members in groups.values():
        if len(members) > 1 and len({tensors[m].dtype for m in members}) == 1:
            kept = _bounded(members, tensors)
            alone.update(set(members) - set(kept))
            if len(kept) > 1:
                leader[kept[0]] = kept
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, Alias] = {}
    grouped = {m for members in leader.values() for m in members}
    shared = {m for members in groups.values() if len(members) > 1 for m in members}
    shared -= grouped | alone
    for name, t in tensors.items():
        if name in leader:
            _plan_group(leader[name], tensors, stored, aliases)
        elif name in shared:  # a re-typed view: its own copy (safetensors refuses shared memory)
            stored[name] = t.clone()
        elif name not in grouped:
            stored[name] = t
    return SharingPlan(stored, aliases)


def _bounded(members: list[str], tensors: dict[str, torch.Tensor]) -> list[str]:
    """The members that can alias their group's base within MAX_ALIAS_AMPLIFICATION (the
    base is the span of storage the members use, as :func:`_plan_group` chooses it)."""
    while len(members) > 1:
        if _tied(members, tensors):  # each alias is its base's size
            return members
        spans = [_extent(tensors[m]) for m in members]
        size = max(s[1] for s in spans) - min(s[0] for s in spans)
        kept = [m for m in members if tensors[m].numel() <= MAX_ALIAS_AMPLIFICATION * size]
        if len(kept) == len(members):
            return members
        members = kept  # the span may shrink without them: check the rest again
    return members


def _plan_group(
    members: list[str],
    tensors: dict[str, torch.Tensor],
    stored: dict[str, torch.Tensor],
    aliases: dict[str, Alias],
) -> None:
    import torch

    first = tensors[members[0]]
    if _tied(members, tensors):  # the same view several times
        stored[members[0]] = first
        shape = tuple(first.shape)
        for m in members[1:]:
            aliases[m] = Alias(members[0], 0, shape, _contiguous_stride(shape))
        return
    spans = [_extent(tensors[m]) for m in members]
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    base_name = next(
        (
            m
            for m in members
            if tensors[m].is_contiguous()
            and tensors[m].storage_offset() == lo
            and tensors[m].numel() == hi - lo
        ),
        None,
    )
    if base_name is None:
        base_name = f"{members[0]}~storage"
        while base_name in tensors:
            base_name += "~"
        stored[base_name] = torch.empty(0, dtype=first.dtype, device=first.device).set_(
            first.untyped_storage(), lo, (hi - lo,), (1,)
        )
    else:
        stored[base_name] = tensors[base_name]
    for m in members:
        if m != base_name:
            t = tensors[m]
            aliases[m] = Alias(
                base_name, int(t.storage_offset()) - lo, tuple(t.shape), tuple(t.stride())
            )


def _geometry(alias: Alias) -> str:
    text = f"offset {alias.offset}, shape {list(alias.shape)}, stride {list(alias.stride)}"
    return text if len(text) <= 160 else text[:157] + "..."


def alias_problem(alias: Alias, base_numel: int) -> str | None:
    """Why ``alias`` is not a valid view of a stored tensor of ``base_numel`` elements, or
    None. The manifest parser can call it for each alias (``base_numel`` from the base's
    ``tensors`` record); :func:`rebuild_alias` calls it for every alias it rebuilds.

    A valid alias has as many sizes as strides; offset, sizes and strides are non-negative
    and fit in int64; unless it has no elements, its last element (``offset + sum((size - 1)
    * stride)``) lies inside the base; and it has at most ``MAX_ALIAS_AMPLIFICATION`` times
    the base's elements (see there for why). Its cost is linear in the manifest line.
    """
    shape, stride, offset = alias.shape, alias.stride, alias.offset
    if len(shape) != len(stride) or offset < 0 or min((*shape, *stride), default=0) < 0:
        return f"has a malformed view ({_geometry(alias)})"
    if max((offset, *shape, *stride)) > _INT64:
        return f"has a size, stride or offset beyond 64 bits ({_geometry(alias)})"
    if 0 in shape:
        return None
    end = offset + 1 + sum((d - 1) * s for d, s in zip(shape, stride, strict=True))
    if end > base_numel:
        return (
            f"reaches past the stored tensor ({_geometry(alias)}: element {end - 1} of a base "
            f"of {base_numel})"
        )
    limit = MAX_ALIAS_AMPLIFICATION * max(base_numel, 1)
    numel = 1
    for d in shape:  # stops as soon as it is too large: no huge products
        numel *= d
        if numel > limit:
            return (
                f"repeats its base's memory too often ({_geometry(alias)}: more than "
                f"{MAX_ALIAS_AMPLIFICATION} times the {base_numel} element(s) stored)"
            )
    return None


def rebuild_alias(base: torch.Tensor, alias: Alias, name: str | None = None) -> torch.Tensor:
    """The view ``alias`` describes, sharing ``base``'s memory.

    Raises ``FormatError`` (naming ``name``, the alias's own name, when given) when the view is
    not valid (:func:`alias_problem`): a damaged or crafted manifest.
    """
    import torch

    what = f"alias {name!r} of {alias.base!r}" if name is not None else f"alias of {alias.base!r}"
    problem = alias_problem(alias, base.numel())
    if problem is not None:
        raise FormatError(f"{what} {problem}")
    try:
        return torch.as_strided(
            base, alias.shape, alias.stride, base.storage_offset() + alias.offset
        )
    except RuntimeError as exc:  # torch's refusal of a view (alias_problem let it through)
        raise FormatError(f"{what} cannot be rebuilt ({_geometry(alias)}: {exc})") from exc
