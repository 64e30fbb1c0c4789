"""The doctor's rules, in the order they run (one hazard per module)."""

from __future__ import annotations

from statekeeper.doctor.rule import Rule
from statekeeper.doctor.rules.loader_augmentation import LoaderAugmentation
from statekeeper.doctor.rules.loader_position import LoaderPosition
from statekeeper.doctor.rules.loader_seed import LoaderSeed

__all__ = ["RULES"]

RULES: tuple[Rule, ...] = (LoaderPosition(), LoaderSeed(), LoaderAugmentation())
