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
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import RUNS_MODEL, FreshModelRule
from statekeeper.doctor.rules._probe import (
    kept_modes,
    nbytes,
    persistent_buffers,
)
from statekeeper.state.compare import NUMERIC, same

__all__ = ["BatchState"]


def _built(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every persistent buffer, by its key, that is built (a lazy module's is not yet)."""
    return {k: v for k, v in persistent_buffers(model).items() if not is_lazy(v)}


class BatchState(FreshModelRule, id="SK005", severity=Severity.ERROR, needs=RUNS_MODEL):
    summary = "a persistent buffer holds per-batch state"

    def probe(self, fresh: Target, model: torch.nn.Module) -> Iterator[Finding]:
        before = {k: v.detach().clone() for k, v in _built(model).items()}
        with kept_modes(model), torch.no_grad():
            fresh.call(model.eval())
        after = _built(model)
        for key, old in before.items():
            new = after.get(key)
            if new is None or same(old, new, NUMERIC):  # values compared as numbers
                continue
            path, _, name = key.rpartition(".")
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
                "return it; or declare it on the class, "
                f"`statekeeper_batch_state = ('{name}',)`, and reset it with "
                "statekeeper.clearing.clear_state(model, "
                "include=statekeeper.clearing.ClearInclude.BATCH_STATE)",
                tensor=name, shape=tuple(new.shape), bytes=nbytes(new), module=path,
            )  # fmt: skip
