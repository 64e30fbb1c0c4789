"""Tensors that share storage are stored once and recorded as views of what is stored.

Tensors are grouped by the storage they live in. A group of one is stored as its values
(a self-overlapping ``expand``/``meshgrid`` tensor is materialized). In a larger group:

- members that are the same view (tied weights) are stored once; the others alias it;
- members that are different views of one storage (a tensor and its slice) alias a single
  stored *base*: a member that covers the whole used span contiguously if there is one,
  else the span itself, stored under ``"<first member>~storage"``.

An alias is ``{"base": stored name, "offset": o, "shape": [...], "stride": [...]}`` in
elements of the base, so ``torch.as_strided(base, shape, stride, offset)`` rebuilds it and
the rebuilt tensors share memory again. Members of one storage with different dtypes are
stored separately (no alias): a re-typed view cannot be rebuilt exactly by ``as_strided``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Alias", "SharingPlan", "plan_sharing", "rebuild_alias"]


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


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    if t.numel() == 0 or t.device.type == "meta":
        return None
    return (str(t.device), t.untyped_storage().data_ptr())


def plan_sharing(tensors: dict[str, torch.Tensor]) -> SharingPlan:
    """Decide which tensors are written and which are re-created as views on load."""
    groups: dict[tuple[str, int], list[str]] = {}
    for name, t in tensors.items():
        key = _storage_key(t)
        if key is not None:
            groups.setdefault(key, []).append(name)
    leader: dict[str, list[str]] = {}
    for members in groups.values():
        if len(members) > 1 and len({tensors[m].dtype for m in members}) == 1:
            leader[members[0]] = members
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, Alias] = {}
    grouped = {m for members in leader.values() for m in members}
    shared = {m for members in groups.values() if len(members) > 1 for m in members} - grouped
    for name, t in tensors.items():
        if name in leader:
            _plan_group(leader[name], tensors, stored, aliases)
        elif name in shared:  # a re-typed view: its own copy (safetensors refuses shared memory)
            stored[name] = t.clone()
        elif name not in grouped:
            stored[name] = t
    return SharingPlan(stored, aliases)


def _plan_group(
    members: list[str],
    tensors: dict[str, torch.Tensor],
    stored: dict[str, torch.Tensor],
    aliases: dict[str, Alias],
) -> None:
    first = tensors[members[0]]
    views = {
        (tensors[m].storage_offset(), tuple(tensors[m].shape), tuple(tensors[m].stride()))
        for m in members
    }
    if len(views) == 1:  # tied: the same view several times
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


def rebuild_alias(base: torch.Tensor, alias: Alias) -> torch.Tensor:
    """The view ``alias`` describes, sharing ``base``'s memory.

    Raises ``ValueError`` when the view does not lie inside ``base`` (a damaged manifest).
    """
    if (
        len(alias.shape) != len(alias.stride)
        or alias.offset < 0
        or any(d < 0 for d in alias.shape)
        or any(s < 0 for s in alias.stride)
    ):
        raise ValueError(f"alias of {alias.base!r} has a malformed view")
    if 0 not in alias.shape:
        end = (
            alias.offset
            + 1
            + sum((d - 1) * s for d, s in zip(alias.shape, alias.stride, strict=True))
        )
        if end > base.numel():
            raise ValueError(f"alias of {alias.base!r} reaches past the stored tensor")
    return torch.as_strided(base, alias.shape, alias.stride, base.storage_offset() + alias.offset)
