"""The transformers ``Trainer``'s training data loader, resumed exactly.

The Trainer resumes mid-epoch by skipping: ``skip_first_batches`` makes a loader whose
batch sampler leaves out the batches already trained, so their samples are never drawn,
and the loader's workers start from fresh seeds. Random augmentation in ``__getitem__``
then draws other numbers than the run that never stopped (the workers' generators are
where a fresh epoch puts them, not where the skipped samples left them), and with
``num_workers=0`` the first batch is drawn before the Trainer restores the RNG.

``StatekeeperTrainer`` builds its training loader as a torchdata ``StatefulDataLoader``
(Accelerate's ``use_stateful_dataloader``) whose workers snapshot their random state
(:func:`statekeeper.data.worker_rng.carry_worker_rng`), saves its state in each
``checkpoint-N`` (each rank its own), and on resume puts the loader back where the saving
run's stood in place of the skip, then restores the RNG before the first batch is drawn.
This module holds those pieces; :mod:`.transformers` calls them.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from transformers import TrainerCallback

from statekeeper.data.worker_rng import carries_worker_rng, carry_worker_rng, warn_late
from statekeeper.distributed.per_rank import PerRank
from statekeeper.errors import StatekeeperWarning
from statekeeper.integrations.accelerate_loaders import AccelerateLoader, unresumable_sampler
from statekeeper.integrations.scoped_wrap import wrapped_while

__all__ = [
    "CheckLoader",
    "persists_across_epochs",
    "Held",
    "build_stateful",
    "entry",
    "resuming",
    "restore",
    "warn_if_inexact",
]

_NAME = "train dataloader"


def _base(loader: Any) -> Any:
    return getattr(loader, "base_dataloader", loader)


def _stateful(loader: Any) -> bool:
    """A loader this module saves and puts back: a prepared ``StatefulDataLoader`` whose
    sampler resumes its order (not torch's ``RandomSampler``: ``use_seedable_sampler=False``
    is resumed the Trainer's way, with a warning at train start)."""
    return (
        hasattr(_base(loader), "next_iter_state")
        and hasattr(loader, "set_epoch")
        and unresumable_sampler(loader) is None
    )


def build_stateful(accelerator: Any, build: Callable[[], Any]) -> Any:
    """``build()`` (the Trainer's own ``get_train_dataloader``) with Accelerate preparing
    a ``StatefulDataLoader``, whose workers carry their random state."""
    config = accelerator.dataloader_config
    before = config.use_stateful_dataloader
    config.use_stateful_dataloader = True
    try:
        loader = build()
    finally:
        config.use_stateful_dataloader = before
    if _stateful(loader) and not carry_worker_rng(_base(loader)):
        warn_late(_base(loader), "Return the loader get_train_dataloader builds, unused")
    return loader


def entry(loader: Any) -> PerRank | None:
    """The loader as a checkpoint entry (each rank's own), or None when it keeps no
    position (a loader of the user's own making)."""
    return PerRank(AccelerateLoader(_NAME, loader)) if _stateful(loader) else None


class Held:
    """A loader's saved state, read with the rest of a checkpoint and applied later, once
    the Trainer has built the loader."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:  # never saved: only loaded into
        return self.saved or {}

    def load_state_dict(self, state: Mapping[str, Any], /) -> None:
        self.saved = dict(state)


def restore(loader: Any, saved: Mapping[str, Any]) -> bool:
    """Put ``loader`` where the saving run's stood (its resumed iterator built now, before
    the RNG is restored). False when ``loader`` keeps no position."""
    if not _stateful(loader):
        return False
    AccelerateLoader(_NAME, loader).load_state_dict(dict(saved))
    return True


def persists_across_epochs(loader: Any, saved: Mapping[str, Any]) -> bool:
    """Whether ``saved`` ended an epoch of ``loader`` whose workers persist: the saving
    run's workers carried their generators into the next epoch, so a resume there puts
    them back (a loader without persistent workers starts the epoch afresh, as the saving
    run's did)."""
    base = _base(loader)
    own = saved.get("loader")
    return (
        _stateful(loader)
        and bool(getattr(base, "persistent_workers", False))
        and bool(getattr(base, "num_workers", 0))
        and isinstance(own, Mapping)
        and bool(own.get("_iterator_finished", False))
    )


def warn_if_inexact(loader: Any) -> None:
    """At train start: a loader with workers whose random state is not saved says so."""
    sampler = unresumable_sampler(loader) if loader is not None else None
    if sampler is not None:
        warnings.warn(
            f"statekeeper: the training data loader shuffles with torch's {sampler} "
            "(accelerator_config use_seedable_sampler=False), which draws a new order when "
            "made again: a run resumed mid-epoch sees other samples than the run that saved. "
            'Pass TrainingArguments(accelerator_config={"use_seedable_sampler": True}) '
            "(the default)",
            StatekeeperWarning,
            stacklevel=2,
        )
        return
    workers = getattr(_base(loader), "num_workers", 0) or 0
    if not workers or (_stateful(loader) and carries_worker_rng(_base(loader))):
        return
    dataset = getattr(loader, "dataset", None)
    if callable(getattr(dataset, "state_dict", None)):
        return  # a Stateful dataset (WorkerRNGDataset...) saves its own
    warnings.warn(
        f"statekeeper: the training data loader has num_workers={workers} and is not the one "
        "StatekeeperTrainer builds (get_train_dataloader is overridden): random numbers its "
        "workers draw in __getitem__ (random augmentation) are not saved, so a run resumed "
        "mid-epoch would augment differently. Build it with super().get_train_dataloader(), "
        "or return torchdata's StatefulDataLoader(statekeeper.data.WorkerRNGDataset(dataset), ...) "
        "prepared by self.accelerator; if __getitem__ draws no random numbers, ignore this.",
        StatekeeperWarning,
        stacklevel=2,
    )


class CheckLoader(TrainerCallback):
    """At train start: a training loader whose workers' random state is not saved warns."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        warn_if_inexact(kwargs.get("train_dataloader"))


_HOOK: contextvars.ContextVar[Callable[[Any, int], Any] | None] = contextvars.ContextVar(
    "statekeeper_resume_loader", default=None
)


class _Skip:
    """``skip_first_batches`` for the Trainer's module: inside :func:`resuming` the hook
    answers first (a loader put back in place), else the real skip."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real

    def __call__(self, dataloader: Any, num_batches: int = 0) -> Any:
        hook = _HOOK.get()
        done = hook(dataloader, num_batches) if hook is not None else None
        return done if done is not None else self.real(dataloader, num_batches)


@contextlib.contextmanager
def resuming(module: Any, hook: Callable[[Any, int], Any]) -> Iterator[None]:
    """While inside (this thread or task), ``module.skip_first_batches`` asks ``hook``
    first: it returns the loader to use, or None for the Trainer's own skip."""
    with wrapped_while(module, "skip_first_batches", _Skip, _HOOK, hook):
        yield
