"""SK011: a loader whose shuffle order comes from a generator that was never seeded.

Seen by the generator's ``initial_seed()``: a ``torch.Generator()`` that was never seeded
reports torch's fixed default seed, and ``shuffle=True`` without any generator draws every
epoch's seed from the global generator. Either way two runs of the same code see different
orders, and a restore that rebuilds the loader cannot know which one the saved run had.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rule import Target
from statekeeper.doctor.rules._base import NOTHING, DoctorRule
from statekeeper.doctor.rules._loaders import loaders, sampler_of

__all__ = ["LoaderSeed"]

_DEFAULT_SEED = torch.Generator().initial_seed()


class LoaderSeed(DoctorRule, id="SK011", severity=Severity.WARNING, needs=NOTHING):
    summary = "data order depends on an unseeded generator"

    def check(self, target: Target) -> Iterator[Finding]:
        for name, _, loader in loaders(target.state):
            own, sampler_gen = loader.generator, getattr(sampler_of(loader), "generator", None)
            roles = [("loader", own)] + (
                [("sampler", sampler_gen)] if sampler_gen is not own else []
            )
            for role, gen in roles:
                if isinstance(gen, torch.Generator) and gen.initial_seed() == _DEFAULT_SEED:
                    yield Finding(
                        self.id, Severity.WARNING, name,
                        f"the {role} generator was never seeded (torch's default seed): the order "
                        "is the same in every run only by accident of construction order",
                        "seed it: torch.Generator().manual_seed(<run seed>)",
                    )  # fmt: skip
