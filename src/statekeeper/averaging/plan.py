"""Planning an offline average from the inputs' manifests alone: what is stored, and whether
every input holds the same tensors (names, shapes, dtypes, tying).

Planning costs time and memory per tensor, and checkpoints with hundreds of thousands of
tensors are averaged too (``bench/average_empty.py``): the newest input (the reference) is
planned in full, every other input is compared with it by whole-value equality of its
skeleton and aliases (C-level) and one pass over its records, and its skeleton is dropped
once compared. Only when something differs are the per-name signatures of that input built,
so that the error lists every difference.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from statekeeper.catalog.location import Location, locate
from statekeeper.checkpoint.reader import read_manifest
from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.aliases import Alias
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.values import Json

__all__ = ["Input", "Sig", "mismatches", "plan_inputs"]


class Sig(NamedTuple):
    """What must agree across inputs for one tensor name (a named tuple: one per tensor)."""

    dtype: str
    shape: tuple[int, ...]
    alias: Alias | None


@dataclass(frozen=True)
class Input:
    """One input checkpoint. ``sigs`` (every tensor in scope: referenced ones and the bases of
    aliases) is filled for the reference input only, ``skeleton`` (the state, or its entry
    ``key``) is dropped (``None``) for the others once compared."""

    location: Location
    manifest: Manifest
    found: bool  # whether the state holds the entry ``key`` (always True without a key)
    skeleton: Json
    sigs: dict[str, Sig]
    compared: bool = False  # found equal to the reference (its skeleton is then dropped)


_REF_TAGS = ("$tensor", "$ndarray")


def _references(skeleton: Json) -> list[str]:
    """The tensor names ``skeleton`` refers to: one walk over its containers, no value built
    (the reference's skeleton is decoded, and checked, when the result is rebuilt)."""
    refs: list[str] = []
    stack = [skeleton]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            if len(item) == 1:
                ((tag, body),) = item.items()
                if tag in _REF_TAGS and type(body) is str:
                    refs.append(body)
                    continue
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
    return refs


def signatures(manifest: Manifest, refs: list[str], where: str) -> dict[str, Sig]:
    """The signature of every tensor in ``refs`` (names a skeleton refers to), and of each
    alias's base."""
    sigs: dict[str, Sig] = {}
    for name in refs:
        sharded = manifest.sharding.tensors.get(name) if manifest.sharding else None
        if sharded is not None:  # a multi-process step: assembled from its chunks on read
            sigs[name] = Sig(sharded.dtype, sharded.shape, None)
            continue
        alias = manifest.aliases.get(name)
        base = alias.base if alias is not None else name
        record = manifest.tensors.get(base)
        if record is None:
            raise CorruptCheckpointError(where, f"state refers to unknown tensor {name!r}")
        sigs[base] = Sig(record.dtype, record.shape, None)
        if alias is not None:
            sigs[name] = Sig(record.dtype, alias.shape, alias)
    return sigs


def _read(location: Location, key: str | None) -> Input:
    manifest = read_manifest(location)
    where = location.path(MANIFEST)
    if location.step >= 0 and manifest.step != location.step:
        raise CorruptCheckpointError(
            where, f"manifest is for step {manifest.step}, not {location.step}"
        )
    if not isinstance(manifest.state, dict):
        raise CorruptCheckpointError(where, "state is not a mapping")
    found = key is None or key in manifest.state
    skeleton = manifest.state if key is None else manifest.state.get(key)
    return Input(location, manifest, found, skeleton, {})


def _same(ref: Input, refs: list[str], inp: Input) -> bool:
    """Whether ``inp`` holds exactly the reference's tensors (a sufficient test, fast: both
    skeletons name the same tensors in the same order, the aliases are equal, and so are the
    records behind them). Other values may differ: they come from the reference."""
    a, b = ref.manifest, inp.manifest
    if not inp.found or a.sharding is not None or b.sharding is not None:
        return False
    if a.aliases != b.aliases or _references(inp.skeleton) != refs:
        return False
    theirs = b.tensors
    for name, sig in ref.sigs.items():
        if sig.alias is None:
            record = theirs.get(name)
            if record is None or record.dtype != sig.dtype or record.shape != sig.shape:
                return False
    return True


def plan_inputs(
    paths: Sequence[str | os.PathLike[str]], key: str | None
) -> tuple[list[Input], int]:
    """Every input read and compared with the newest (highest step; on a tie the last path),
    and the index of that one. Raises ``CorruptCheckpointError`` for a damaged manifest; the
    caller lists the differences (:func:`mismatches`) when an input does not match.

    Memory: the steps are known from their locations, so the newest is read first, then each
    other input is read, compared and reduced to what its tensors are read by (its records)
    before the next is read; an input named twice is read once."""
    locations = [locate(path, None) for path in paths]
    if any(loc.step < 0 for loc in locations):  # a step folder without a number: read all
        read = [_read(loc, key) for loc in locations]
        steps = [inp.manifest.step for inp in read]
    else:
        read, steps = [], [loc.step for loc in locations]
    newest = max(range(len(locations)), key=lambda i: (steps[i], i))
    ref = read[newest] if read else _read(locations[newest], key)
    refs = _references(ref.skeleton) if ref.found else []
    ref = replace(ref, sigs=signatures(ref.manifest, refs, ref.location.path(MANIFEST)))
    done: dict[str, Input] = {ref.location.path(): ref}
    inputs: list[Input] = []
    for i, location in enumerate(locations):
        if i == newest:
            inputs.append(ref)
            continue
        known = done.get(location.path())
        if known is not None:  # the same step again: the same records
            inputs.append(known)
            continue
        inp = read[i] if read else _read(location, key)
        if _same(ref, refs, inp):  # what is left is what its tensors are read by
            inp = replace(
                inp, manifest=replace(inp.manifest, state=None), skeleton=None, compared=True
            )
        elif inp.found:
            where = inp.location.path(MANIFEST)
            inp = replace(inp, sigs=signatures(inp.manifest, _references(inp.skeleton), where))
        done[location.path()] = inp
        inputs.append(inp)
    return inputs, newest


def mismatches(inputs: list[Input], ref: Input, key: str | None) -> list[str]:
    """Every difference between the inputs and the reference ``ref`` (inputs found equal by
    :func:`plan_inputs` have no ``sigs`` and are skipped)."""
    problems: list[str] = []
    ref_path = ref.location.path()
    for inp in inputs:
        path = inp.location.path()
        if not inp.found:
            held = ", ".join(map(str, inp.manifest.state)) or "nothing"
            problems.append(f"{key}: no such entry in {path} (it holds: {held})")
            continue
        if inp is ref or inp.compared:
            continue
        for name in sorted(ref.sigs.keys() | inp.sigs.keys()):
            a, b = ref.sigs.get(name), inp.sigs.get(name)
            if a is None:
                problems.append(f"{name}: in {path} but not in {ref_path}")
            elif b is None:
                problems.append(f"{name}: in {ref_path} but missing from {path}")
            elif a.shape != b.shape:
                problems.append(f"{name}: shape {b.shape} in {path}, {a.shape} in {ref_path}")
            elif a.dtype != b.dtype:
                problems.append(f"{name}: dtype {b.dtype} in {path}, {a.dtype} in {ref_path}")
            elif a.alias != b.alias:
                problems.append(f"{name}: shares memory differently in {path} and {ref_path}")
    return problems
