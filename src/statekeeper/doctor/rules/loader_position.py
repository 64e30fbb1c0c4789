"""SK010: a data loader whose position cannot be saved or restored exactly.

Seen by type: a plain ``DataLoader`` (no state at all; with a ResumableSampler but not
wrapped, its sampler runs ahead of the loop by the prefetched batches), or a torchdata
``StatefulDataLoader`` whose sampler is one of torch's stateless random samplers (the
restore draws a new permutation).
"""

from __future__ import annotations

from collections.abc import Iterator

from statekeeper.data.sampler import ResumableSampler
from statekeeper.data.torchdata import UNRESUMABLE_SAMPLERS, is_stateful_dataloader
from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import NOTHING, DoctorRule
from statekeeper.doctor.rules._loaders import loaders, sampler_of

__all__ = ["LoaderPosition"]


class LoaderPosition(DoctorRule, id="SK010", severity=Severity.ERROR, needs=NOTHING):
    summary = "data loader cannot resume its exact position"

    def check(self, target: Target) -> Iterator[Finding]:
        for name, obj, loader in loaders(target.state):
            sampler = sampler_of(loader)
            if is_stateful_dataloader(obj):
                if type(sampler) in UNRESUMABLE_SAMPLERS:
                    yield Finding(
                        self.id, Severity.ERROR, name,
                        f"StatefulDataLoader samples with torch's {type(sampler).__name__}, whose "
                        "iterator keeps no state: a restore draws a different permutation",
                        "use shuffle=True with generator=torch.Generator().manual_seed(...), "
                        "torchdata's stateful_dataloader.sampler.RandomSampler, or "
                        "statekeeper.data.ResumableSampler",
                    )  # fmt: skip
            elif obj is loader:
                resumable = isinstance(sampler, ResumableSampler)
                yield Finding(
                    self.id, Severity.ERROR, name,
                    "a plain DataLoader has no state: a resumed run starts its epoch over"
                    + (" (its ResumableSampler runs ahead of the loop by the prefetched batches)"
                       if resumable else ""),
                    "wrap it: statekeeper.data.ResumableLoader(DataLoader(..., "
                    "sampler=statekeeper.data.ResumableSampler(dataset, seed=...)))",
                )  # fmt: skip
