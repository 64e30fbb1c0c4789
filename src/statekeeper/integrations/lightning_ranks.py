"""Each rank's own state in a multi-process Lightning checkpoint.

Lightning writes one checkpoint, rank 0's: its loops hold rank 0's loader positions (with
its workers' snapshots, ``WorkerRNGDataset``'s random state among them) and
``StatekeeperCallback``'s RNG entry is rank 0's. Every rank builds the checkpoint though
(``on_save_checkpoint`` runs on each), so the callback gathers each rank's RNG state and
loader states into the checkpoint (:func:`gather`), and on resume every rank puts its own
back in place of rank 0's before Lightning reads them (:func:`pick`). A checkpoint saved by
another number of ranks is refused for its per-rank part, with the fix. A checkpoint saved
by one process and resumed by several (a scale-up) holds one RNG and one set of loader
states: every rank resumes that one, which is legitimate but not what each rank would have
drawn, so it is said (:class:`SharedRankStateWarning`, naming what is shared and the fix).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from statekeeper.errors import LoadStateError, StatekeeperWarning, user_stacklevel

__all__ = ["SharedRankStateWarning", "gather", "pick"]


class SharedRankStateWarning(StatekeeperWarning):
    """A Lightning checkpoint saved by one process is resumed by several: every rank
    resumes that process's RNG and data-loader state (the same random numbers on each
    rank). The message names what is shared and how to give each rank its own."""


_RANKS = "statekeeper_ranks"  # [{"rng": ..., "loaders": ...} per rank]


def _loaders_of(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict")
    return state if isinstance(state, dict) and "combined_loader" in state else None


def _distributed() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


def gather(checkpoint: dict[str, Any], rng: dict[str, Any]) -> None:
    """On every rank: each rank's RNG and loader states into ``checkpoint`` (a collective:
    Lightning builds the checkpoint on every rank)."""
    if not _distributed() or torch.distributed.get_world_size() < 2:
        return
    holder = _loaders_of(checkpoint)
    mine = {"rng": rng, "loaders": None if holder is None else holder["combined_loader"]}
    every: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(every, mine)  # the job's own processes' states
    checkpoint[_RANKS] = every


def pick(checkpoint: dict[str, Any], rng_key: str) -> None:
    """On every rank, before Lightning loads ``checkpoint``: this rank's RNG and loader
    states in place of rank 0's."""
    ranks = checkpoint.pop(_RANKS, None)
    if not isinstance(ranks, list):
        _shared(checkpoint, rng_key)
        return
    if _distributed():
        world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    else:  # one process: rank 0's states were saved for another number of ranks' samplers
        world, rank = 1, 0
    if len(ranks) != world:
        raise LoadStateError(
            f"the checkpoint holds the RNG and data-loader states of {len(ranks)} ranks, the "
            f"run has {world}: resume with {len(ranks)} processes (devices x num_nodes), or "
            "from a checkpoint saved as an epoch ended with load_state_dict of the weights only"
        )
    own = ranks[rank]
    checkpoint[rng_key] = own["rng"]
    holder = _loaders_of(checkpoint)
    if holder is not None and own["loaders"] is not None:
        holder["combined_loader"] = own["loaders"]


def _shared(checkpoint: dict[str, Any], rng_key: str) -> None:
    """Warn (on rank 0) when one process's per-rank state is resumed by several ranks."""
    if not _distributed() or torch.distributed.get_world_size() < 2:
        return
    shared = []
    if checkpoint.get(rng_key) is not None:
        shared.append(
            "its RNG state (Python, numpy, torch: dropout and augmentation draw "
            "the same numbers on every rank)"
        )
    holder = _loaders_of(checkpoint)
    if holder is not None and holder["combined_loader"]:
        shared.append(
            "its data-loader states (position, sampler and worker RNG, of one process's sampler)"
        )
    if not shared or torch.distributed.get_rank() != 0:
        return
    world = torch.distributed.get_world_size()
    warnings.warn(
        f"statekeeper: the checkpoint was saved by 1 process and is resumed by {world}: every "
        f"rank resumes {' and '.join(shared)}. To give each rank its own, reseed per rank "
        "once resumed (e.g. in on_train_start: lightning's seed_everything(seed + "
        "trainer.global_rank)) and resume the data from a checkpoint saved as an epoch ended; "
        "a checkpoint saved by as many processes as resume it restores each rank's own",
        SharedRankStateWarning,
        stacklevel=user_stacklevel(),
    )
