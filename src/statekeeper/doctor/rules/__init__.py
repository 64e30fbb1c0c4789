"""The doctor's rules, in the order they run (one hazard per module)."""

from __future__ import annotations

from statekeeper.doctor.rule import Rule
from statekeeper.doctor.rules.batch_state import BatchState
from statekeeper.doctor.rules.derived_constant import DerivedConstant
from statekeeper.doctor.rules.loader_augmentation import LoaderAugmentation
from statekeeper.doctor.rules.loader_position import LoaderPosition
from statekeeper.doctor.rules.loader_seed import LoaderSeed
from statekeeper.doctor.rules.mode_dependent import ModeDependent
from statekeeper.doctor.rules.overlap import MemoryOverlap
from statekeeper.doctor.rules.pickle_values import PickleValues
from statekeeper.doctor.rules.registration_order import RegistrationOrder
from statekeeper.doctor.rules.shared_storage import SharedStorage
from statekeeper.doctor.rules.transient_tensors import TransientTensors
from statekeeper.doctor.rules.uncaptured_state import UncapturedState

__all__ = ["RULES"]

RULES: tuple[Rule, ...] = (
    MemoryOverlap(),
    RegistrationOrder(),
    DerivedConstant(),
    TransientTensors(),
    BatchState(),
    UncapturedState(),
    SharedStorage(),
    PickleValues(),
    ModeDependent(),
    LoaderPosition(),
    LoaderSeed(),
    LoaderAugmentation(),
)
