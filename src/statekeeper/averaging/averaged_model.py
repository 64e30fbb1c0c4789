"""``AveragedModel``: a drop-in for ``torch.optim.swa_utils.AveragedModel`` that gets state right.

Same constructor, ``forward``, ``update_parameters``, ``.module``, ``.n_averaged`` and
``state_dict``. What differs (see docs/averaging.md):

- buffers follow an explicit :class:`BufferPolicy` (``use_buffers`` maps onto it); integer
  and bool buffers are never averaged, always copied; non-persistent buffers follow it too;
- tied parameters are updated once; the copy is matched to the source by name and shape at
  every update, and a mismatch is an error naming the keys (never a ``zip`` truncation);
- tensor lists are built once and updated with fused ``_foreach`` kernels, rebuilt only when
  the source's tensors change; no host synchronisation per update;
- rules (:class:`EMA` with warmup, :class:`SWA`) and their counters live in buffers, so a
  resumed average is bitwise identical; ``averaged=`` avoids ``deepcopy``;
- the copy's parameters do not require grad (torch's keep ``requires_grad=True``): an
  optimizer over a module holding its EMA skips it, and DDP does not wait for its gradients.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import torch
from torch import Tensor, nn

from statekeeper.averaging.pairing import Pairing, pair_tensors
from statekeeper.averaging.rules import SWA, AveragingRule
from statekeeper.errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["AveragedModel", "BufferPolicy"]

AvgFn = Callable[[Tensor, Tensor, Tensor | int], Tensor]
MultiAvgFn = Callable[[list[Tensor], list[Tensor], Tensor | int], None]


class BufferPolicy(StrEnum):
    """What happens to the *floating-point* buffers of the average at each update."""

    AVERAGE = "average"  # averaged like parameters (torch's use_buffers=True)
    COPY = "copy"  # copied from the source model (torch's use_buffers=False)
    IGNORE = "ignore"  # left alone (recompute them with update_bn)


def _policy(use_buffers: bool, buffers: BufferPolicy | None) -> BufferPolicy:
    if buffers is None:
        return BufferPolicy.AVERAGE if use_buffers else BufferPolicy.COPY
    if not isinstance(buffers, BufferPolicy):
        raise InvalidArgumentError(
            f"buffers must be a statekeeper.averaging.BufferPolicy, got {buffers!r}"
        )
    if use_buffers and buffers is not BufferPolicy.AVERAGE:
        raise InvalidArgumentError(
            f"use_buffers=True conflicts with buffers={buffers}; pass one of them"
        )
    return buffers


class AveragedModel(nn.Module):
    """An EMA/SWA average of ``model``; see the module docstring for what it fixes.

    Args:
        model: The model to average.
        device: Where the average lives; ``None`` keeps the model's devices.
        avg_fn: torch's per-tensor ``avg_fn(averaged, current, num_averaged)``.
        multi_avg_fn: torch's list ``multi_avg_fn`` (from :func:`get_ema_multi_avg_fn`...).
        use_buffers: torch's flag: average the buffers too (see ``buffers``).
        buffers: :class:`BufferPolicy`: what happens to each buffer, explicitly.
        rule: An :class:`AveragingRule` (:class:`EMA`, :class:`SWA`) instead of
            ``avg_fn`` / ``multi_avg_fn``.
        averaged: The module (or a factory of it) that holds the average, instead of a deep
            copy of ``model``.

    Raises:
        InvalidArgumentError: Both ``rule`` and ``avg_fn``/``multi_avg_fn``, a ``buffers``
            that is no :class:`BufferPolicy`, or ``averaged`` that is ``model`` itself.
    """

    n_averaged: Tensor
    n_calls: Tensor

    def __init__(
        self,
        model: nn.Module,
        device: int | torch.device | str | None = None,
        avg_fn: AvgFn | None = None,
        multi_avg_fn: MultiAvgFn | None = None,
        use_buffers: bool = False,
        *,
        buffers: BufferPolicy | None = None,
        rule: AveragingRule | None = None,
        averaged: nn.Module | Callable[[], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise InvalidArgumentTypeError(
                f"model must be a torch.nn.Module (the model to average), got "
                f"{type(model).__name__}; pass the module itself, e.g. AveragedModel(model)"
            )
        if rule is not None and (avg_fn is not None or multi_avg_fn is not None):
            raise InvalidArgumentError("pass either rule= or avg_fn=/multi_avg_fn=, not both")
        if rule is not None and not isinstance(rule, AveragingRule):
            raise InvalidArgumentError(
                f"rule must be statekeeper.averaging.EMA(...) or SWA(...), got {rule!r}"
            )
        self.buffer_policy = _policy(bool(use_buffers), buffers)
        self.use_buffers = self.buffer_policy is BufferPolicy.AVERAGE
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.rule: AveragingRule = rule or SWA()
        self.module = self._build(model, averaged)
        if device is not None:
            self.module = self.module.to(device)
        # the copy is written by update_parameters (under no_grad), never by backward: a
        # requires_grad copy would be handed to optimizers built from .parameters() and make
        # DDP wait for gradients that never come ("parameters that were not used")
        self.module.requires_grad_(False)
        self.register_buffer("n_averaged", torch.tensor(0, dtype=torch.long, device=device))
        self.register_buffer("n_calls", torch.tensor(0, dtype=torch.long, device=device))
        self._averaged = 0  # host mirrors of the two counters: no sync per update
        self._calls = 0
        self._pairing: Pairing | None = None

    @staticmethod
    def _build(model: nn.Module, averaged: nn.Module | Callable[[], nn.Module] | None) -> nn.Module:
        if averaged is None:
            return copy.deepcopy(model)
        built = averaged if isinstance(averaged, nn.Module) else averaged()
        if not isinstance(built, nn.Module):
            raise InvalidArgumentError(
                f"averaged= must be an nn.Module or a factory of one, got {built!r}"
            )
        if built is model:
            raise InvalidArgumentError("averaged= must be a separate copy, not the model itself")
        with torch.no_grad():  # validates names and shapes, then starts from the model's values
            pair_tensors(built, model, average_buffers=True).copy_all()
        return built

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _pairs(self, model: nn.Module) -> Pairing:
        if self._pairing is None or not self._pairing.still_matches(model):
            self._pairing = pair_tensors(self.module, model, average_buffers=self.use_buffers)
        return self._pairing

    @torch.no_grad()
    def update_parameters(self, model: nn.Module) -> None:
        """Fold ``model``'s current weights into the average (and copy or skip buffers).

        Args:
            model: The model being trained, of the averaged model's structure.

        Raises:
            KeyMismatchError: ``model``'s parameters or buffers differ in names, shapes or dtypes
                from the average's.
        """
        pairing = self._pairs(model)
        call, self._calls = self._calls, self._calls + 1
        self.n_calls.add_(1)
        rule = self.rule
        if call < rule.update_after_step:
            pairing.copy_averaged()  # follow the model until averaging starts
        elif (call - rule.update_after_step) % rule.every == 0:
            self._average(pairing)
            self._averaged += 1
            self.n_averaged.add_(1)
        if self.buffer_policy is not BufferPolicy.IGNORE:
            pairing.copy_buffers(include_float=self.buffer_policy is BufferPolicy.COPY)

    def _average(self, pairing: Pairing) -> None:
        n = self._averaged
        if n == 0:
            pairing.copy_averaged()
        elif self.multi_avg_fn is not None or self.avg_fn is not None:
            count = self.n_averaged
            for dst, src in pairing.groups():
                if self.multi_avg_fn is not None:
                    self.multi_avg_fn(dst, src, count.to(dst[0].device))
                else:
                    for d, s in zip(dst, src, strict=True):
                        d.copy_(self.avg_fn(d, s, count.to(d.device)))  # type: ignore[misc]
        else:
            weight = self.rule.weight(n)
            for dst, src in pairing.groups():
                torch._foreach_lerp_(dst, src, weight)

    def _apply(self, fn: Any, recurse: bool = True) -> AveragedModel:
        self._pairing = None  # .to() / .double() may give the copy's tensors new storage
        return super()._apply(fn, recurse)  # type: ignore[no-untyped-call,no-any-return]

    statekeeper_derivable_keys = ("n_calls",)
    """State-dict keys this module derives when a checkpoint lacks them (torch's layout):
    ``statekeeper.load`` does not count them as missing."""

    def _load_from_state_dict(
        self, state_dict: Any, prefix: str, local_metadata: Any, strict: bool,
        missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str],
    ) -> None:  # fmt: skip
        """Our own state, or torch's ``AveragedModel``'s, strictly too, however it arrives
        (``load_state_dict`` on this module or on one that holds it, ``statekeeper.load``):
        torch's has no ``n_calls``, which is derived from its ``n_averaged`` (torch averages
        at every call: the calls that gave that many averages under this model's rule)."""
        calls, averaged = f"{prefix}n_calls", f"{prefix}n_averaged"
        if calls not in state_dict and averaged in state_dict:
            state_dict[calls] = self._calls_for(state_dict[averaged])
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        self._averaged = int(self.n_averaged.item())  # host mirrors: one sync, at load only
        self._calls = int(self.n_calls.item())
        self._pairing = None

    def _calls_for(self, n_averaged: Any) -> Tensor:
        averaged = torch.as_tensor(n_averaged, dtype=torch.long)
        rule = self.rule
        calls = rule.update_after_step + (averaged - 1) * rule.every + 1
        return torch.where(averaged > 0, calls, torch.zeros_like(averaged))

    def torch_state_dict(self) -> dict[str, Any]:
        """This average's state in the layout ``torch.optim.swa_utils.AveragedModel`` loads
        strictly: the same entries without ``n_calls`` (torch counts only ``n_averaged``).

        Returns:
            This module's ``state_dict()`` without its ``n_calls`` entry.
        """
        state = self.state_dict()
        state.pop("n_calls")
        return state

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pairing"] = None  # holds references to the source model's tensors
        return state
