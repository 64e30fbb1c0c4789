"""SK005: a persistent buffer holding per-batch state (recurrent or membrane state, caches).

Seen on a fresh instance from the factory: every persistent buffer (one the state_dict
holds) is copied, one forward runs in eval mode under ``no_grad``, and each buffer whose
value, dtype or shape changed is reported. Running statistics (BatchNorm and friends) do
not change in eval mode, so they are never reported; buffers a lazy module has not built
yet are skipped. A checkpoint of such a model depends on the last batch it saw, and the
buffer's shape may follow the batch size, so a resumed run (or a load with another batch
size) sees something else. Every RNG the forward or the factory draws from is restored.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.nn.parameter import is_lazy

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Need, Target
from statekeeper.doctor.rules.overlap import isolated_rng, not_fresh

__all__ = ["BatchState"]


def _persistent(model: torch.nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """(module path, buffer name) -> the buffer, for every built persistent buffer."""
    out: dict[tuple[str, str], torch.Tensor] = {}
    for path, module in model.named_modules():
        for name, buf in module._buffers.items():
            if buf is None or name in module._non_persistent_buffers_set or is_lazy(buf):
                continue
            out[path, name] = buf
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
    return bool(torch.equal(a, b))


class BatchState:
    id = "SK005"
    summary = "a persistent buffer holds per-batch state"
    severity = Severity.ERROR
    needs: frozenset[Need] = frozenset({Need.MODEL, Need.FACTORY, Need.INPUT})

    def check(self, target: Target) -> Iterator[Finding]:
        with isolated_rng():
            fresh = target.fresh()
            model = fresh.model
            if model is None or model is target.model:
                yield not_fresh(self.id)
                return
            before = {k: v.detach().clone() for k, v in _persistent(model).items()}
            modes = {m: m.training for m in model.modules()}
            model.eval()
            try:
                with torch.no_grad():
                    fresh.call(model)
            finally:
                for m, training in modes.items():
                    m.training = training
            after = _persistent(model)
        for (path, name), old in before.items():
            new = after.get((path, name))
            if new is None or _same(old, new):
                continue
            key = f"{path}.{name}" if path else name
            if old.shape != new.shape:
                size = (
                    f" and its shape follows the batch ({tuple(old.shape)} -> {tuple(new.shape)}),"
                    " so a fresh instance cannot load the checkpoint"
                )
            else:
                size = " (and its shape may follow the batch size)"
            yield Finding(
                self.id, self.severity, path or "model",
                f"persistent buffer '{key}' changes during an eval-mode forward under no_grad: "
                f"it holds per-batch state, so the checkpoint depends on the last batch "
                f"seen{size}",
                f"keep per-batch state out of the state_dict (register_buffer('{name}', ..., "
                "persistent=False)) and reset it explicitly, or pass it in as an argument and "
                "return it",
                tensor=name, shape=tuple(new.shape), bytes=new.numel() * new.element_size(),
            )  # fmt: skip
