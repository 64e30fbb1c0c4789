"""Copying verified tensors straight into a live module: ``load_state_dict`` without its
per-tensor Python loop, and onto CUDA through pinned host memory.

``nn.Module.load_state_dict`` visits every module and calls ``param.copy_(saved)`` once per
tensor under ``no_grad``: about 5 us of Python per tensor, and a pageable (slow, blocking)
host-to-device copy for CUDA parameters. Where the outcome is provably the same, statekeeper
copies every tensor in one fused ``torch._foreach_copy_`` instead: ``bench/io.py``'s state
(3,304 tensors, 1 GiB) copies in 0.070 s instead of 0.083 s through ``load_state_dict``, and
``load``'s own key, shape and dtype comparison of the module is the plan's (docs/guide.md,
"Load order and checks").

The fast path is taken only when the module tree would be loaded by torch's own default
code and nothing else could observe the difference:

- every module's class keeps ``nn.Module``'s ``_load_from_state_dict`` (or BatchNorm's or
  InstanceNorm's, which differ only for checkpoints older than torch 0.4), ``state_dict``,
  ``_save_to_state_dict``, ``get_extra_state`` and ``set_extra_state``, and the top one its
  ``load_state_dict``; none of these is set on a module instance; no module has load or
  state-dict hooks; and torch is not set to swap tensors on load
  (``torch.__future__.set_swap_module_params_on_conversion``);
- the saved keys are exactly the persistent parameters and buffers that default loading
  visits (no extra state, nothing missing or unexpected), and ``state_dict()`` would list
  the same keys (no state-dict hooks or overrides), so ``load``'s key, shape and dtype
  checks of the module are already done by ``direct_pairs``;
- every live tensor is a plain ``Tensor``/``Parameter`` (no subclass, no lazy or meta
  tensor) of the saved shape and dtype, and every saved value is a CPU tensor.

Anything else goes through ``load_state_dict`` unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["STAGING_BYTES", "Pair", "copy_pairs", "direct_pairs"]

STAGING_BYTES = 64 << 20
"""Size of each of the two pinned host buffers that carry CUDA-bound values."""

Pair = tuple[torch.Tensor, torch.Tensor]  # (live destination, saved source)

# torch's own overrides that only add or drop keys of checkpoints older than torch 0.4 and
# then defer to nn.Module's: with the saved keys exactly the live ones, they load the same
_DEFAULT_LOADS = frozenset(
    {
        nn.Module._load_from_state_dict,
        nn.modules.batchnorm._NormBase._load_from_state_dict,
        nn.modules.instancenorm._InstanceNorm._load_from_state_dict,
    }
)
_DEFAULT_TOP = nn.Module.load_state_dict
_PLAIN = (torch.Tensor, nn.Parameter)
_ALIGN = 64


# methods whose override (by the class, or set on the instance) means other loading code
_OWN = (
    "_load_from_state_dict",
    "load_state_dict",
    "_save_to_state_dict",
    "state_dict",
    "get_extra_state",
    "set_extra_state",
)


def _default_loading(module: nn.Module) -> bool:
    """Loaded by torch's default code, with ``state_dict()`` keys exactly those it visits."""
    cls = type(module)
    return (
        cls._load_from_state_dict in _DEFAULT_LOADS
        and cls._save_to_state_dict is nn.Module._save_to_state_dict
        and cls.state_dict is nn.Module.state_dict
        and cls.get_extra_state is nn.Module.get_extra_state
        and cls.set_extra_state is nn.Module.set_extra_state
        and not any(name in module.__dict__ for name in _OWN)
        and not module._load_state_dict_pre_hooks
        and not module._load_state_dict_post_hooks
        and not module._state_dict_pre_hooks
        and not module._state_dict_hooks
    )


def _live(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, torch.Tensor] | None]:
    """What default loading copies into, key by key; ``None`` where it would do more."""
    if not _default_loading(module):
        yield None
        return
    for name, p in module._parameters.items():
        if p is not None:
            yield prefix + name, p
    for name, b in module._buffers.items():
        if b is not None and name not in module._non_persistent_buffers_set:
            yield prefix + name, b
    for name, child in module._modules.items():
        if child is not None:
            yield from _live(child, f"{prefix}{name}.")


def direct_pairs(module: nn.Module, saved: Mapping[str, Any]) -> list[Pair] | None:
    """(live, saved) tensor pairs for one fused copy, or ``None`` where ``load_state_dict``
    must run (see the module docstring). Tied tensors are copied once, from the last key
    that names them, as the repeated ``copy_`` of default loading leaves them."""
    if type(module).load_state_dict is not _DEFAULT_TOP:
        return None
    if torch.__future__.get_swap_module_params_on_conversion():
        return None
    by_tensor: dict[int, Pair] = {}
    seen = 0
    plain, tensor = _PLAIN, torch.Tensor
    for item in _live(module):
        if item is None:
            return None
        key, live = item
        value = saved.get(key)
        if (
            type(value) is not tensor
            or not value.is_cpu
            or type(live) not in plain  # exact types: no subclass, no UninitializedParameter
            or live.is_meta
            or value.shape != live.shape
            or value.dtype != live.dtype
        ):
            return None
        seen += 1
        if id(live) in by_tensor:  # re-insert: the last key's value is copied, in order
            del by_tensor[id(live)]
        by_tensor[id(live)] = (live, value)
    if seen != len(saved):  # keys default loading would not visit: let it report them
        return None
    return list(by_tensor.values())


def copy_pairs(pairs: list[Pair], staging_bytes: int = STAGING_BYTES) -> None:
    """Copy every saved value into its live tensor: CPU ones in one fused call, others
    through two reused pinned buffers (see ``_Staging``)."""
    on_cpu = [(d, s) for d, s in pairs if d.device.type == "cpu"]
    with torch.no_grad():
        if on_cpu:
            torch._foreach_copy_([d.detach() for d, _ in on_cpu], [s for _, s in on_cpu])
        by_device: dict[torch.device, list[Pair]] = {}
        for d, s in pairs:
            if d.device.type != "cpu":
                by_device.setdefault(d.device, []).append((d, s))
        for device, group in by_device.items():
            _Staging(device, staging_bytes).copy(group)


class _Staging:
    """Host-to-device copies through two pinned buffers used in turn.

    Saved values are packed into one buffer (a CPU copy) while the device copies the other
    one's contents asynchronously; a buffer is refilled only after the device has finished
    reading it (an event per buffer). Values larger than a buffer go in flat pieces when the
    destination is contiguous; a large non-contiguous destination is copied directly.
    Without CUDA (tests) the buffers are ordinary memory and every copy is synchronous.
    """

    def __init__(self, device: torch.device, size: int) -> None:
        self.device = device
        self.size = max(-size % _ALIGN + size, _ALIGN)  # holds an element of any dtype
        cuda = device.type == "cuda"
        self.buffers = [  # on the host whatever torch's default device is
            torch.empty(self.size, dtype=torch.uint8, device="cpu", pin_memory=cuda) for _ in "ab"
        ]
        self.events: list[Any] = [None, None]
        self.current = 0
        self.fill = 0
        self.pending: list[tuple[torch.Tensor, int, int, torch.Tensor]] = []

    def copy(self, pairs: list[Pair]) -> None:
        for live, value in pairs:
            dst = live.detach()
            nbytes = value.numel() * value.element_size()
            if nbytes <= self.size:
                self._stage(dst, value)
            elif dst.is_contiguous():
                flat_dst, flat_src = dst.view(-1), value.contiguous().view(-1)
                step = max(self.size // value.element_size(), 1)
                for start in range(0, flat_src.numel(), step):
                    self._stage(flat_dst[start : start + step], flat_src[start : start + step])
            else:
                self._flush()
                dst.copy_(value)
        self._flush()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _stage(self, dst: torch.Tensor, value: torch.Tensor) -> None:
        nbytes = value.numel() * value.element_size()
        if nbytes == 0:
            return
        start = -self.fill % _ALIGN + self.fill  # every dtype view of the buffer is aligned
        if start + nbytes > self.size:
            self._flush()
            start = 0
        self.buffers[self.current][start : start + nbytes].view(value.dtype).view(
            value.shape
        ).copy_(value)
        self.pending.append((dst, start, nbytes, value))
        self.fill = start + nbytes

    def _flush(self) -> None:
        """Send the current buffer's values to the device and switch to the other buffer."""
        if not self.pending:
            return
        buffer = self.buffers[self.current]
        for dst, start, nbytes, value in self.pending:
            staged = buffer[start : start + nbytes].view(value.dtype).view(value.shape)
            dst.copy_(staged, non_blocking=self.device.type == "cuda")
        if self.device.type == "cuda":
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(self.device))
            self.events[self.current] = event
        self.pending = []
        self.fill = 0
        self.current = 1 - self.current
        waiting = self.events[self.current]
        if waiting is not None:  # the device may still be reading the buffer we refill next
            waiting.synchronize()
            self.events[self.current] = None
