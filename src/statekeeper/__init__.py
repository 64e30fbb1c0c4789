"""statekeeper: training state that survives. Faithful, safe and fast checkpoints for PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"

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
from statekeeper.checkpoint.info import CheckpointInfo, RestoreInfo
from statekeeper.checkpoint.listing import list_checkpoints, list_partial, remove_partial
from statekeeper.checkpoint.load import Strict, load, read
from statekeeper.checkpoint.policies import (
    AtSteps,
    EverySeconds,
    EverySteps,
    KeepBest,
    KeepEvery,
    KeepLatest,
    Mode,
    Retention,
    SavePolicy,
)
from statekeeper.checkpoint.save import save
from statekeeper.data.loader import ResumableLoader
from statekeeper.data.sampler import ResumableBatchSampler, ResumableSampler
from statekeeper.data.seeding import SeededDataset
from statekeeper.data.worker_rng import WorkerRNGDataset
from statekeeper.distributed.scope import PerRank, Scope
from statekeeper.errors import (
    CorruptCheckpointError,
    InvalidArgumentError,
    KeyMismatchError,
    LoadStateError,
    RankFailure,
    StatekeeperError,
    StatekeeperWarning,
    StepExistsError,
    StepNotFoundError,
    StorageError,
    UnsafePickleError,
    UnsupportedFormatError,
    UnsupportedValueError,
    WriterConflictError,
)
from statekeeper.interop.convert import convert
from statekeeper.interop.diff import DiffResult, diff
from statekeeper.interop.export import export
from statekeeper.interop.tied import TiedKeys
from statekeeper.state.optimizer import OptimizerChange
from statekeeper.state.rng import RNGState
from statekeeper.stateful import Stateful, Value
from statekeeper.storage.base import SharedStorage, Storage, Transaction
from statekeeper.storage.fsspec import FsspecStorage
from statekeeper.storage.local import LocalStorage
from statekeeper.storage.memory import InjectedFailure, MemoryStorage

__all__ = [
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
    "RNGState",
    "ResumableBatchSampler",
    "ResumableLoader",
    "ResumableSampler",
    "Retention",
    "SavePolicy",
    "SeededDataset",
    "CorruptCheckpointError",
    "DiffResult",
    "InjectedFailure",
    "InvalidArgumentError",
    "KeyMismatchError",
    "LoadStateError",
    "RankFailure",
    "PerRank",
    "Scope",
    "SharedStorage",
    "FsspecStorage",
    "LocalStorage",
    "MemoryStorage",
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
]
