"""Which step an incremental save may link from, so that no one damaged file takes every
step that retention keeps.

Steps that share a hard link share one copy of its data: a bad sector in it damages all of
them. So a save links from a step ``X`` only when some other step that stays after the save
(what ``retention`` keeps, the newest step, and steps whose manifest cannot be read, which
retention never deletes) shares no file with ``X``; the new step then shares none with that
step either. Among the steps that qualify it takes the one that leaves the *newest*
independent copy, the newer one on a tie: in a run that keeps its two newest steps (or
more), the saves alternate between two chains of links, so two consecutive steps never
share data and a damaged file costs at most one step. Where no step qualifies, the save
writes every file (in such a run, its second save). Where retention keeps only the new step
(``KeepLatest(1)``) any step qualifies: the newest is taken.

Only a storage with ``identity`` (local hard links) is constrained: an object store's copy
is an independent object, so the newest step is always taken there.
"""

from __future__ import annotations

from collections.abc import Mapping

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.catalog.listing import list_checkpoints
from statekeeper.catalog.location import committed
from statekeeper.catalog.naming import ParsedEntry, step_entry
from statekeeper.checkpoint.retention_policies import Retention
from statekeeper.format.values import Json
from statekeeper.format.values_decode import decode_value
from statekeeper.incremental.reuse import Previous, step_files
from statekeeper.storage.base import Storage
from statekeeper.storage.optional import identity_of

__all__ = ["CANDIDATES", "link_source"]

CANDIDATES = 4
"""How many of the newest committed steps are considered as the step to link from."""


def link_source(
    storage: Storage, step: int, retention: Retention | None, metrics: Mapping[str, Json]
) -> Previous | None:
    """The step the save of ``step`` may link from, with its files; None: write every file.
    ``retention``: the policy applied after the save (None: every step stays); ``metrics``:
    the new step's (a policy may rank it by them)."""
    newest_first = [p for p in committed(storage) if p.step != step][::-1]
    if not newest_first:
        return None
    if getattr(storage, "identity", None) is None:
        return step_files(storage, newest_first[0])  # reuse makes independent copies
    staying = _staying(storage, step, retention, metrics, newest_first)
    shared: dict[str, frozenset[object]] = {}

    def identities(parsed: ParsedEntry, files: Previous | None = None) -> frozenset[object]:
        if parsed.name not in shared:
            found = files or step_files(storage, parsed)
            names = () if found is None else found.files
            ids = (identity_of(storage, parsed.name, n) for n in names)
            shared[parsed.name] = frozenset(i for i in ids if i is not None)
        return shared[parsed.name]

    best: tuple[int, Previous] | None = None
    for candidate in newest_first[:CANDIDATES]:
        files = step_files(storage, candidate)
        if files is None:
            continue
        if not staying:
            return files  # nothing else stays: no copy to keep apart from
        mine = identities(candidate, files)
        independent = next(
            (
                s.step
                for s in staying
                if s.name != candidate.name and identities(s).isdisjoint(mine)
            ),
            None,
        )
        if independent is not None and (best is None or independent > best[0]):
            best = (independent, files)
    return None if best is None else best[1]


def _staying(
    storage: Storage,
    step: int,
    retention: Retention | None,
    metrics: Mapping[str, Json],
    newest_first: list[ParsedEntry],
) -> list[ParsedEntry]:
    """The committed steps other than ``step`` that stay after its save, newest first."""
    if retention is None:
        return newest_first
    infos = [i for i in list_checkpoints(storage) if i.step != step]
    try:
        decoded = {k: decode_value(v, k, _no_tensor) for k, v in metrics.items()}
        new = CheckpointInfo(step, storage.describe(step_entry(step)), 0, None, metrics=decoded)
        kept = set(retention.keep([*(i for i in infos if i.error is None), new]))
    except Exception:  # a policy that cannot say: assume every step stays
        return newest_first
    kept |= {i.step for i in infos if i.error is not None}  # never deleted by retention
    kept.add(max(step, newest_first[0].step))
    return [p for p in newest_first if p.step in kept]


def _no_tensor(tag: str, name: str) -> object:
    raise ValueError(f"metric {name!r} is a tensor")
