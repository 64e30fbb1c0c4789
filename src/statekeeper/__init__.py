"""statekeeper: training state that survives. Faithful, safe and fast checkpoints for PyTorch.

The public API is imported on first use (PEP 562), so ``import statekeeper`` and the
command line start without importing torch until something needs it (``statekeeper ls``
of a run never does).
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from statekeeper import extensions as _extensions
from statekeeper._version import __version__

if _typing.TYPE_CHECKING:
    from statekeeper.averaging.averaged_model import AveragedModel, BufferPolicy
    from statekeeper.averaging.bn import update_bn
    from statekeeper.averaging.functions import (
        get_ema_avg_fn,
        get_ema_multi_avg_fn,
        get_swa_avg_fn,
        get_swa_multi_avg_fn,
    )
    from statekeeper.averaging.offline import average_checkpoints
    from statekeeper.averaging.rules import EMA, SWA, AveragingRule
    from statekeeper.checkpoint.checkpointer import Checkpointer
    from statekeeper.checkpoint.incremental import Incremental
    from statekeeper.checkpoint.info import CheckpointInfo, RestoreInfo
    from statekeeper.checkpoint.inspection import InspectReport
    from statekeeper.checkpoint.listing import list_checkpoints, list_partial, remove_partial
    from statekeeper.checkpoint.load import Strict, load
    from statekeeper.checkpoint.mirror import Mirror, MirrorStatus
    from statekeeper.checkpoint.origin_level import Origin
    from statekeeper.checkpoint.policies import (
        AtSteps,
        EverySeconds,
        EverySteps,
        KeepBest,
        KeepEvery,
        KeepLatest,
        Mode,
        OnSignal,
        Retention,
        SavePolicy,
    )
    from statekeeper.checkpoint.retention import PendingRemoval, RetentionStatus
    from statekeeper.checkpoint.save import save
    from statekeeper.checkpoint.scope import Scope
    from statekeeper.checkpoint.verification import StepVerifyReport, VerifyReport
    from statekeeper.data.loader import ResumableLoader
    from statekeeper.data.sampler import ResumableBatchSampler, ResumableSampler
    from statekeeper.data.seeding import SeededDataset
    from statekeeper.data.worker_rng import WorkerRNGDataset
    from statekeeper.distributed.per_rank import PerRank
    from statekeeper.errors import (
        CheckpointUnreadableError,
        CorruptCheckpointError,
        InvalidArgumentError,
        InvalidArgumentTypeError,
        KeyMismatchError,
        LoadStateError,
        LocationError,
        MirrorError,
        OutputExistsError,
        RankFailure,
        StatekeeperError,
        StatekeeperWarning,
        StateMismatchError,
        StepExistsError,
        StepNotFoundError,
        StorageError,
        UnsafePickleError,
        UnsupportedFormatError,
        UnsupportedValueError,
        WriterConflictError,
    )
    from statekeeper.interop.convert import convert
    from statekeeper.interop.diff import DiffReport, diff
    from statekeeper.interop.export import export
    from statekeeper.interop.foreign_report import ForeignReport
    from statekeeper.interop.inspection import inspect
    from statekeeper.interop.reading import read
    from statekeeper.interop.tied import TiedKeys
    from statekeeper.interop.verification import verify
    from statekeeper.progress import Progress
    from statekeeper.state.clearing import (
        ClearAction,
        Cleared,
        ClearInclude,
        ClearMode,
        ClearReport,
        clear_state,
        register_clear_rule,
    )
    from statekeeper.state.optimizer import OptimizerChange
    from statekeeper.state.rng import RNGState
    from statekeeper.stateful import Stateful, Value
    from statekeeper.storage.base import SharedStorage, Storage, Transaction
    from statekeeper.storage.fsspec import FsspecStorage
    from statekeeper.storage.local import LocalStorage
    from statekeeper.storage.memory import InjectedFailure, MemoryStorage

_EXPORTS = {
    "AtSteps": "statekeeper.checkpoint.policies",
    "AveragedModel": "statekeeper.averaging.averaged_model",
    "AveragingRule": "statekeeper.averaging.rules",
    "BufferPolicy": "statekeeper.averaging.averaged_model",
    "CheckpointInfo": "statekeeper.checkpoint.info",
    "Checkpointer": "statekeeper.checkpoint.checkpointer",
    "CheckpointUnreadableError": "statekeeper.errors",
    "CorruptCheckpointError": "statekeeper.errors",
    "DiffReport": "statekeeper.interop.diff",
    "EMA": "statekeeper.averaging.rules",
    "EverySeconds": "statekeeper.checkpoint.policies",
    "EverySteps": "statekeeper.checkpoint.policies",
    "FsspecStorage": "statekeeper.storage.fsspec",
    "Incremental": "statekeeper.checkpoint.incremental",
    "Origin": "statekeeper.checkpoint.origin_level",
    "InjectedFailure": "statekeeper.storage.memory",
    "InvalidArgumentError": "statekeeper.errors",
    "InvalidArgumentTypeError": "statekeeper.errors",
    "KeepBest": "statekeeper.checkpoint.policies",
    "KeepEvery": "statekeeper.checkpoint.policies",
    "KeepLatest": "statekeeper.checkpoint.policies",
    "KeyMismatchError": "statekeeper.errors",
    "LoadStateError": "statekeeper.errors",
    "LocationError": "statekeeper.errors",
    "LocalStorage": "statekeeper.storage.local",
    "MemoryStorage": "statekeeper.storage.memory",
    "Mirror": "statekeeper.checkpoint.mirror",
    "MirrorError": "statekeeper.errors",
    "OutputExistsError": "statekeeper.errors",
    "MirrorStatus": "statekeeper.checkpoint.mirror",
    "PendingRemoval": "statekeeper.checkpoint.retention",
    "RetentionStatus": "statekeeper.checkpoint.retention",
    "Mode": "statekeeper.checkpoint.policies",
    "OnSignal": "statekeeper.checkpoint.policies",
    "OptimizerChange": "statekeeper.state.optimizer",
    "Progress": "statekeeper.progress",
    "PerRank": "statekeeper.distributed.per_rank",
    "RNGState": "statekeeper.state.rng",
    "ClearAction": "statekeeper.state.clearing",
    "ClearInclude": "statekeeper.state.clearing",
    "ClearMode": "statekeeper.state.clearing",
    "ClearReport": "statekeeper.state.clearing",
    "Cleared": "statekeeper.state.clearing",
    "clear_state": "statekeeper.state.clearing",
    "register_clear_rule": "statekeeper.state.clearing",
    "RankFailure": "statekeeper.errors",
    "RestoreInfo": "statekeeper.checkpoint.info",
    "ResumableBatchSampler": "statekeeper.data.sampler",
    "ResumableLoader": "statekeeper.data.loader",
    "ResumableSampler": "statekeeper.data.sampler",
    "Retention": "statekeeper.checkpoint.policies",
    "SWA": "statekeeper.averaging.rules",
    "SavePolicy": "statekeeper.checkpoint.policies",
    "Scope": "statekeeper.checkpoint.scope",
    "SeededDataset": "statekeeper.data.seeding",
    "SharedStorage": "statekeeper.storage.base",
    "Stateful": "statekeeper.stateful",
    "StatekeeperError": "statekeeper.errors",
    "StateMismatchError": "statekeeper.errors",
    "StatekeeperWarning": "statekeeper.errors",
    "StepExistsError": "statekeeper.errors",
    "StepNotFoundError": "statekeeper.errors",
    "Storage": "statekeeper.storage.base",
    "StorageError": "statekeeper.errors",
    "Strict": "statekeeper.checkpoint.load",
    "TiedKeys": "statekeeper.interop.tied",
    "Transaction": "statekeeper.storage.base",
    "UnsafePickleError": "statekeeper.errors",
    "UnsupportedFormatError": "statekeeper.errors",
    "UnsupportedValueError": "statekeeper.errors",
    "Value": "statekeeper.stateful",
    "WorkerRNGDataset": "statekeeper.data.worker_rng",
    "WriterConflictError": "statekeeper.errors",
    "average_checkpoints": "statekeeper.averaging.offline",
    "convert": "statekeeper.interop.convert",
    "diff": "statekeeper.interop.diff",
    "export": "statekeeper.interop.export",
    "get_ema_avg_fn": "statekeeper.averaging.functions",
    "get_ema_multi_avg_fn": "statekeeper.averaging.functions",
    "get_swa_avg_fn": "statekeeper.averaging.functions",
    "get_swa_multi_avg_fn": "statekeeper.averaging.functions",
    "list_checkpoints": "statekeeper.checkpoint.listing",
    "list_partial": "statekeeper.checkpoint.listing",
    "load": "statekeeper.checkpoint.load",
    "read": "statekeeper.interop.reading",
    "remove_partial": "statekeeper.checkpoint.listing",
    "save": "statekeeper.checkpoint.save",
    "update_bn": "statekeeper.averaging.bn",
    "inspect": "statekeeper.interop.inspection",
    "verify": "statekeeper.interop.verification",
    "ForeignReport": "statekeeper.interop.foreign_report",
    "InspectReport": "statekeeper.checkpoint.inspection",
    "StepVerifyReport": "statekeeper.checkpoint.verification",
    "VerifyReport": "statekeeper.checkpoint.verification",
}


def _install_extensions() -> None:
    """Register the layers above the core with it (run before the first save or load): the
    data loaders' adapters, and the job-wide save and load (:mod:`statekeeper.extensions`)."""
    _importlib.import_module("statekeeper.data")
    _importlib.import_module("statekeeper.distributed")


_extensions.add_installer(_install_extensions)


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'statekeeper' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "ClearAction",
    "ClearInclude",
    "ClearMode",
    "ClearReport",
    "Cleared",
    "clear_state",
    "register_clear_rule",
    "Progress",
    "StateMismatchError",
    "LocationError",
    "CheckpointUnreadableError",
    "EMA",
    "SWA",
    "AtSteps",
    "AveragedModel",
    "AveragingRule",
    "BufferPolicy",
    "CheckpointInfo",
    "Checkpointer",
    "EverySeconds",
    "EverySteps",
    "KeepBest",
    "KeepEvery",
    "KeepLatest",
    "Mode",
    "OnSignal",
    "RNGState",
    "ResumableBatchSampler",
    "ResumableLoader",
    "ResumableSampler",
    "Retention",
    "SavePolicy",
    "SeededDataset",
    "CorruptCheckpointError",
    "DiffReport",
    "Incremental",
    "Origin",
    "InjectedFailure",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "KeyMismatchError",
    "LoadStateError",
    "RankFailure",
    "PerRank",
    "Scope",
    "SharedStorage",
    "FsspecStorage",
    "LocalStorage",
    "MemoryStorage",
    "Mirror",
    "MirrorError",
    "MirrorStatus",
    "OutputExistsError",
    "PendingRemoval",
    "RetentionStatus",
    "RestoreInfo",
    "StatekeeperError",
    "StatekeeperWarning",
    "Stateful",
    "StepExistsError",
    "StepNotFoundError",
    "Storage",
    "StorageError",
    "OptimizerChange",
    "Strict",
    "TiedKeys",
    "Transaction",
    "UnsafePickleError",
    "UnsupportedFormatError",
    "UnsupportedValueError",
    "Value",
    "WorkerRNGDataset",
    "WriterConflictError",
    "__version__",
    "get_ema_avg_fn",
    "get_ema_multi_avg_fn",
    "get_swa_avg_fn",
    "get_swa_multi_avg_fn",
    "average_checkpoints",
    "convert",
    "diff",
    "export",
    "list_checkpoints",
    "list_partial",
    "load",
    "read",
    "remove_partial",
    "save",
    "update_bn",
    "inspect",
    "verify",
    "ForeignReport",
    "InspectReport",
    "StepVerifyReport",
    "VerifyReport",
]
