"""Pairing the averaged copy's tensors with the source model's, by name, once.

Parameters are taken with ``named_parameters()`` (a tied parameter appears once, so it is
updated once) and buffers with ``named_buffers()`` (persistent or not). Every name must
exist on both sides with the same shape and dtype; otherwise ``KeyMismatchError`` lists
every difference. The pairs are grouped by (device, dtype) for ``_foreach`` kernels and
kept until the source's tensors change. The pairs hold the Parameter and buffer objects
themselves (not detached views), so code that swaps a tensor's ``.data`` (``Module.to``,
``.double()``) is followed; a replaced parameter or buffer object is detected by a check of
the owning modules' slots at each update (a dict lookup per tensor, no module-tree walk).
Submodules added to the source after the first update are not detected: build the average
after the model is complete.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from statekeeper.errors import KeyMismatchError

__all__ = ["Pairing", "pair_tensors"]

Group = tuple[list[Tensor], list[Tensor]]


Slot = tuple[dict[str, Any], str, Any]


def _slots(model: nn.Module) -> list[Slot]:
    slots: list[Slot] = []
    for module in model.modules():
        slots += [(module._parameters, k, t) for k, t in module._parameters.items()]
        slots += [(module._buffers, k, t) for k, t in module._buffers.items()]
    return slots


def _group(pairs: list[tuple[Tensor, Tensor]]) -> list[Group]:
    groups: dict[tuple[torch.device, torch.dtype], Group] = {}
    for dst, src in pairs:
        dsts, srcs = groups.setdefault((dst.device, dst.dtype), ([], []))
        dsts.append(dst)
        srcs.append(src)
    return list(groups.values())


class Pairing:
    """The matched tensors: what is averaged, float buffers, and integer/bool buffers."""

    def __init__(
        self,
        source: nn.Module,
        averaged: list[tuple[Tensor, Tensor]],
        float_buffers: list[tuple[Tensor, Tensor]],
        exact_buffers: list[tuple[Tensor, Tensor]],
    ) -> None:
        self._slots = _slots(source)
        self._averaged = _group(averaged)
        self._float_buffers = _group(float_buffers)
        self._exact_buffers = _group(exact_buffers)
        self._moves = any(d.device != s.device for d, s in averaged + float_buffers + exact_buffers)

    def still_matches(self, source: nn.Module) -> bool:
        return all(d.get(k) is t for d, k, t in self._slots)

    def _on_device(self, groups: list[Group]) -> Iterator[Group]:
        for dsts, srcs in groups:
            if self._moves:
                srcs = [s.to(d.device, non_blocking=True) for d, s in zip(dsts, srcs, strict=True)]
            yield dsts, srcs

    def groups(self) -> Iterator[Group]:
        """(averaged tensors, source tensors on their device) per device and dtype."""
        return self._on_device(self._averaged)

    def copy_averaged(self) -> None:
        for dsts, srcs in self.groups():
            torch._foreach_copy_(dsts, srcs)

    def copy_buffers(self, *, include_float: bool) -> None:
        for dsts, srcs in self._on_device(
            self._exact_buffers + (self._float_buffers if include_float else [])
        ):
            torch._foreach_copy_(dsts, srcs)

    def copy_all(self) -> None:
        self.copy_averaged()
        self.copy_buffers(include_float=True)


def pair_tensors(averaged: nn.Module, source: nn.Module, *, average_buffers: bool) -> Pairing:
    """Match ``averaged`` to ``source`` by name; ``average_buffers`` puts float buffers with the
    parameters. Raises KeyMismatchError listing every missing, extra or reshaped tensor."""
    problems: list[str] = []
    pairs: dict[str, list[tuple[Tensor, Tensor]]] = {"averaged": [], "float": [], "exact": []}
    for kind, dst_items, src_items in (
        ("parameter", averaged.named_parameters(), source.named_parameters()),
        ("buffer", averaged.named_buffers(), source.named_buffers()),
    ):
        dst_map, src_map = dict(dst_items), dict(src_items)
        problems += [
            f"{kind} {n}: in the averaged copy, not in the model"
            for n in dst_map
            if n not in src_map
        ]
        problems += [
            f"{kind} {n}: in the model, not in the averaged copy"
            for n in src_map
            if n not in dst_map
        ]
        for name in dst_map.keys() & src_map.keys():
            dst, src = dst_map[name], src_map[name]
            if dst.shape != src.shape or dst.dtype != src.dtype:
                problems.append(
                    f"{kind} {name}: {src.dtype}{tuple(src.shape)} in the model, "
                    f"{dst.dtype}{tuple(dst.shape)} in the averaged copy"
                )
                continue
            floating = dst.is_floating_point() or dst.is_complex()
            bucket = (
                ("averaged" if kind == "parameter" or average_buffers else "float")
                if floating
                else "exact"
            )
            if kind == "parameter" and not floating:
                bucket = "exact"
            pairs[bucket].append((dst, src))
    if problems:
        raise KeyMismatchError(
            sorted(problems), "Average a model of the same structure as the copy."
        )
    return Pairing(source, pairs["averaged"], pairs["float"], pairs["exact"])
