"""Resuming from the newest step of two tiers: the local one and its mirror.

What is newest is decided from both listings. The mirror's is one listing of its top level
(:mod:`statekeeper.loop.mirror.candidates`: its cost does not grow with what the steps hold
nor with prefixes that are no step), and each step's commit marker is asked for only when
that step is tried. It is retried with backoff, each request bounded by ``Mirror.timeout``;
a mirror that cannot be listed is never taken for an empty one:

- with steps on the local tier, the mirror's listing is given ``Mirror.timeout`` seconds in
  all to answer; without an answer the local tier's newest step is loaded, with a warning that a
  newer step only the mirror may hold (from another node) was not looked for;
- with an empty local tier, ``MirrorError`` is raised after the retries: a run is never
  started from scratch because its mirror did not answer.

Steps are then tried newest first, the local copy of a step before the mirror's. A local
step that is damaged is skipped with a warning (the mirror's copy of it comes next). A
download that fails its checksums (bits flipped in transit) is downloaded again, up to
``Mirror.retries`` times, and skipped with a warning only when every copy read fails; a step
the mirror holds but cannot deliver (unreachable after the retries) raises ``MirrorError``
instead of loading an older step.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from typing import Any

from statekeeper.catalog.info import RestoreInfo
from statekeeper.catalog.location import Location, committed
from statekeeper.checkpoint.load import Strict, load, load_located
from statekeeper.checkpoint.scope import Scope
from statekeeper.errors import (
    CheckpointUnreadableError,
    MirrorError,
    StatekeeperWarning,
    StepNotFoundError,
    user_stacklevel,
)
from statekeeper.loop.mirror.candidates import Candidate, candidates, committed_name
from statekeeper.loop.mirror.config import Mirror
from statekeeper.loop.mirror.remote import within
from statekeeper.state.optimizer import OptimizerChange
from statekeeper.storage.base import Storage

__all__ = ["load_of_tiers", "newest_of_tiers"]


def _warn(message: str) -> None:
    warnings.warn(f"statekeeper: {message}", StatekeeperWarning, stacklevel=user_stacklevel())


def _mirror_steps(
    local: Storage, local_steps: list[int], remote: Storage, mirror: Mirror
) -> list[Candidate] | None:
    """The steps the mirror may hold; None (warned about) when it did not answer in time
    and the local tier has steps of its own."""
    where = remote.describe()
    if local_steps:
        bound = mirror.timeout
    else:  # every retry, each request bounded by the client: a backstop only
        bound = (mirror.retries + 2) * mirror.timeout + mirror.backoff * 2**mirror.retries
    try:
        return within(bound, lambda: candidates(remote), f"listing {where}")
    except OSError as exc:  # a store's StorageError, or a local disk's own (a mount gone)
        if local_steps:
            _warn(
                f"cannot list the mirror {where} within {bound:g} s ({exc}); resuming from "
                f"the local tier's newest step {local_steps[-1]} without knowing whether the "
                "mirror holds a newer one (saved from another node). Check the mirror's "
                "endpoint, or give it longer with Mirror(timeout=...), and restore again to "
                "look there"
            )
            return None
        raise MirrorError(
            f"cannot list the mirror {where} ({exc}) and the local tier {local.describe()} "
            "holds no step: a run is not started from scratch while its mirror may hold its "
            "steps. Make the mirror reachable and restore again; to start a new run, give "
            "it a new mirror target (or no mirror=)"
        ) from exc


def _download(
    remote: Storage, found: Candidate, mirror: Mirror, state: Mapping[str, Any], **options: Any
) -> RestoreInfo | None:
    """Load the step ``found`` from the mirror; None when it is not committed there (an
    upload in progress, or cut), or (warned about) when it is gone or every copy read was
    damaged."""
    last: CheckpointUnreadableError | None = None
    step = found.step
    for attempt in range(mirror.retries + 1):
        try:
            name = committed_name(remote, found)  # each request retried already
            if name is None:
                return None
            return load_located(Location(remote, name, step), state, **options)
        except StepNotFoundError as exc:
            _warn(f"skipping deleted step {step} of {remote.describe()}: {exc}")
            return None
        except CheckpointUnreadableError as exc:  # damaged there, or in transit: read again
            last = exc
            if attempt < mirror.retries:
                time.sleep(mirror.backoff * 2**attempt)
        except OSError as exc:  # each request was retried already (StorageError, a disk's)
            raise MirrorError(
                f"step {step}, the newest step of the run, is on the mirror "
                f"{remote.describe()} but could not be downloaded ({exc}); an older step is "
                "not loaded in its place. Make the mirror reachable and restore again",
                [step],
            ) from exc
    _warn(
        f"skipping damaged step {step} of {remote.describe()}: {mirror.retries + 1} "
        f"downloads failed their checks ({last}); loading an older step"
    )
    return None


def newest_of_tiers(
    local: Storage,
    remote: Storage,
    mirror: Mirror,
    state: Mapping[str, Any],
    *,
    strict: Strict,
    scope: Scope,
    on_optimizer_change: OptimizerChange,
) -> RestoreInfo | None:
    """Load into ``state`` the newest step intact on ``local`` or ``remote`` (see the module
    docstring); None when neither tier holds one."""
    local_steps = [p.step for p in committed(local)]
    remote_found = {c.step: c for c in _mirror_steps(local, local_steps, remote, mirror) or []}
    tried = sorted(
        [(s, 0) for s in local_steps] + [(s, 1) for s in remote_found],
        key=lambda c: (-c[0], c[1]),
    )
    options: dict[str, Any] = {"strict": strict, "on_optimizer_change": on_optimizer_change}
    for step, tier in tried:
        if tier == 1:
            info = _download(remote, remote_found[step], mirror, state, **options)
            if info is not None:
                return info
            continue
        try:
            return load(local, state, step=step, scope=scope, **options)
        except (CheckpointUnreadableError, StepNotFoundError) as exc:
            what = "deleted" if isinstance(exc, StepNotFoundError) else "damaged"
            _warn(f"skipping {what} step {step} of {local.describe()}: {exc}")
    return None


def load_of_tiers(
    local: Storage,
    remote: Storage,
    mirror: Mirror,
    state: Mapping[str, Any],
    step: int | None,
    *,
    strict: Strict,
    scope: Scope,
    on_optimizer_change: OptimizerChange,
) -> RestoreInfo:
    """Load ``step`` (None: the newest step either tier lists) into ``state``: the local
    copy when the local tier holds it, else the mirror's. Nothing is skipped: a damaged
    step raises, and a step neither tier holds is a ``StepNotFoundError``."""
    local_steps = [p.step for p in committed(local)]
    remote_found = {c.step: c for c in _mirror_steps(local, local_steps, remote, mirror) or []}
    wanted = max([*local_steps, *remote_found], default=None) if step is None else step
    options: dict[str, Any] = {"strict": strict, "on_optimizer_change": on_optimizer_change}
    if wanted in local_steps:
        return load(local, state, step=wanted, scope=scope, **options)
    found = None if wanted is None else remote_found.get(wanted)
    name = None if found is None else committed_name(remote, found)
    if found is None or name is None:
        what = "no committed step" if wanted is None else f"no committed step {wanted}"
        raise StepNotFoundError(
            f"{local.describe()} and its mirror {remote.describe()} hold {what}; pass a step "
            "that statekeeper.list_checkpoints() lists for either of them"
        )
    return load_located(Location(remote, name, found.step), state, **options)
