"""Random augmentation in DataLoader workers that a mid-epoch resume reproduces exactly.

A ``Dataset.__getitem__`` that draws random numbers (random crops, flips, noise) draws from
the global RNGs of whichever process runs it: with ``num_workers > 0``, a worker process
seeded when it starts. torchdata's ``StatefulDataLoader`` resumes the *order* of the samples
exactly, but it does not know about those generators, so a run resumed mid-epoch hands the
same samples other augmentations and silently diverges.

:class:`WorkerRNGDataset` carries them through torchdata's own per-worker snapshot: it is a
``Stateful`` dataset whose state is the RNG state of the process it runs in (Python's
``random``, numpy's global generator and torch's CPU generator). ``StatefulDataLoader``
snapshots each worker's dataset state together with the batches that worker produced, and
on resume restores it in the new worker before the first item is drawn, so every worker
continues its random stream where the saved run left it (``persistent_workers`` on or off).
In the main process (``num_workers=0``) it holds the main process's generators, which
statekeeper restores anyway (the ``Checkpointer``'s RNG entry, restored last).

:func:`carry_worker_rng` does the same for a loader whose dataset is the user's own,
without wrapping it: integrations that own the loader's route call it before the first
batch. It chains the loader's ``worker_init_fn`` so that, inside each worker and after the
user's own initialisation, the worker's copy of the dataset gets the same ``state_dict`` /
``load_state_dict`` (the dataset in the main process is left as it is).
:func:`workers_without_rng` names the workers whose snapshot in a loader's state holds no
random state, for the warning that says so.
"""

from __future__ import annotations

import random
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from statekeeper.errors import StatekeeperWarning, user_stacklevel
from statekeeper.stateful import is_stateful

__all__ = [
    "WorkerRNGDataset",
    "carries_worker_rng",
    "carry_worker_rng",
    "warn_late",
    "workers_without_rng",
]

T = TypeVar("T")


def _process_rng() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def _set_process_rng(state: Mapping[str, Any]) -> None:
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    np.random.set_state(tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])


class WorkerRNGDataset(torch.utils.data.Dataset[T], Generic[T]):
    """``dataset``, with the random state of the process that draws its items saved and
    restored by ``StatefulDataLoader`` (see the module docstring).

    Args:
        dataset: The dataset to wrap.
    """

    def __init__(self, dataset: torch.utils.data.Dataset[T]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> T:
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:  # the wrapped dataset's own attributes
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def state_dict(self) -> dict[str, Any]:
        return _process_rng()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _set_process_rng(state)


class _CarryRNG:
    """A ``worker_init_fn``: the loader's own first, then the worker's dataset copy made
    ``Stateful`` with the worker's RNG as its state (a picklable object, for spawned
    workers)."""

    def __init__(self, user: Callable[[int], None] | None) -> None:
        self.user = user
        self.late: weakref.ref[Any] | None = None  # the iterator whose workers lack the hook

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker gets the hook, not the mark
        return {"user": self.user, "late": None}

    def __call__(self, worker_id: int) -> None:
        if self.user is not None:
            self.user(worker_id)
        info = torch.utils.data.get_worker_info()
        dataset = getattr(info, "dataset", None)
        if dataset is None or is_stateful(dataset):
            return  # the dataset's own state (a WorkerRNGDataset's, or the user's)
        try:
            dataset.state_dict = _process_rng
            dataset.load_state_dict = _set_process_rng
        except (AttributeError, TypeError):  # __slots__...: workers_without_rng reports it
            return


def carry_worker_rng(loader: Any) -> bool:
    """Have the workers of the torchdata ``StatefulDataLoader`` ``loader`` save their random
    state with their snapshots and restore it on resume (see the module docstring); whether
    it came in time. Call it before the loader's first ``iter``: workers already running
    are not changed, and :func:`carries_worker_rng` is False while their iterator is the
    loader's (with ``persistent_workers``, for good): the caller warns then
    (:func:`warn_late`, or its own save-time check of the snapshots). Does nothing for a
    loader without workers, or one whose dataset is ``Stateful`` already."""
    if isinstance(loader.worker_init_fn, _CarryRNG):
        return carries_worker_rng(loader)  # a second call: still late if the first was
    hook = _CarryRNG(loader.worker_init_fn)
    loader.worker_init_fn = hook
    if getattr(loader, "_initial_iter_for_state_dict", False):
        # an iterator that a state_dict() call built before the first batch (Accelerate's
        # prepare does) started its workers without the hook: dropped, unused, so that the
        # first iter() builds one (torchdata's own attributes: it has no public way)
        loader._initial_iter_for_state_dict = False
        loader._iterator = None
    running = getattr(loader, "_iterator", None)
    if running is None or not int(getattr(loader, "num_workers", 0) or 0):
        return True
    hook.late = weakref.ref(running)  # its workers started without the hook
    return False


def warn_late(loader: Any, fix: str) -> None:
    """Say that :func:`carry_worker_rng` came after ``loader``'s workers had started;
    ``fix`` is the caller's way to hand the loader over in time."""
    until = "never: persistent_workers keeps them" if loader.persistent_workers else "next epoch"
    warnings.warn(
        "statekeeper: the worker random state of a StatefulDataLoader was asked to be saved "
        "after its workers had started (its iterator was made): their draws are not saved "
        f"until the loader makes a new iterator ({until}). {fix}, or wrap the dataset: "
        "StatefulDataLoader(statekeeper.data.WorkerRNGDataset(dataset), ...)",
        StatekeeperWarning,
        stacklevel=user_stacklevel(),
    )


def carries_worker_rng(loader: Any) -> bool:
    """Whether the workers of ``loader``'s current iterator save their random state:
    :func:`carry_worker_rng` was applied before they started (or an iterator made since
    started them)."""
    hook = getattr(loader, "worker_init_fn", None)
    if not isinstance(hook, _CarryRNG):
        return False
    late = None if hook.late is None else hook.late()
    return late is None or getattr(loader, "_iterator", None) is not late


def workers_without_rng(state: Mapping[str, Any]) -> list[str]:
    """The workers (``worker_0``...) whose snapshot in a ``StatefulDataLoader``'s
    ``state_dict()`` holds no dataset state, so no random state: their draws would not
    resume. Empty for a loader without workers or an iterator not started."""
    snapshot = state.get("_snapshot") or {}
    workers = snapshot.get("_worker_snapshots") or {}
    return sorted(
        name
        for name, worker in workers.items()
        if isinstance(worker, Mapping)
        and worker.get("dataset_state") is None
        and worker.get("fetcher_state") is None
    )
