"""``verify``: check every byte of a statekeeper step or run, as a typed report; a foreign
checkpoint is refused by name (it carries no checksums to verify). No torch."""

from __future__ import annotations

import os

from statekeeper.arguments import require_callable
from statekeeper.catalog.detect import Format, foreign_format
from statekeeper.catalog.frameworks import FrameworkFolder, framework_folder
from statekeeper.catalog.location import Location, PathOrStorage
from statekeeper.catalog.verification import VerifyReport, step_locations, verify_locations
from statekeeper.errors import InvalidArgumentError, StepNotFoundError
from statekeeper.progress import Progress

__all__ = ["verify", "verify_targets"]


def _framework_steps(folder: FrameworkFolder, step: int | None) -> list[Location]:
    """The statekeeper steps of a framework folder's entries; its entries in the framework's
    own format have no checksums (``statekeeper verify`` reads those in full)."""
    found = [
        location
        for entry in folder.entries
        if entry.format is Format.STATEKEEPER
        for location in step_locations(entry.path)
        if step is None or location.step == step
    ]
    if not found:
        raise StepNotFoundError(
            f"{folder.path} is a {folder.framework} folder without statekeeper steps"
            f"{'' if step is None else f' of step {step}'}: its entries carry no checksums. "
            "Run `statekeeper verify` on it to read them in full, or save with statekeeper's "
            f"{folder.framework} integration"
        )
    return found


def verify_targets(path: PathOrStorage, step: int | None = None) -> list[Location]:
    """The committed steps :func:`verify` checks
    (:func:`~statekeeper.catalog.verification.step_locations`), after refusing a foreign
    checkpoint with ``InvalidArgumentError``."""
    folder = framework_folder(path) if isinstance(path, str | os.PathLike) else None
    if folder is not None:
        return _framework_steps(folder, step)
    foreign = foreign_format(path)
    if foreign is not None:
        raise InvalidArgumentError(
            f"{foreign[0]} is a {foreign[1]} checkpoint, not a statekeeper step: it carries no "
            "checksums to verify. Read it with `statekeeper inspect`, or make a checksummed "
            "statekeeper step of it with `statekeeper convert`"
        )
    return step_locations(path, step)


def verify(
    path: PathOrStorage, *, step: int | None = None, progress: Progress | None = None
) -> VerifyReport:
    """Verify every byte of a statekeeper step, or of every committed step of a run.

    ``path`` is a step or run directory, a URL (``s3://bucket/run``) or a ``Storage``;
    ``step`` picks one step of a run. A folder of framework checkpoints (Lightning
    ``*.ckpt`` steps, Trainer ``checkpoint-N``, Accelerate ``checkpoints/``) has the
    statekeeper steps of its entries verified. For each step, the manifest's self-checksum, every
    file's size and checksum, every safetensors header and every tensor record are checked,
    without building a tensor (no torch). A damaged step does not raise: its entry in
    :attr:`VerifyReport.steps <statekeeper.catalog.verification.VerifyReport.steps>` has
    ``ok`` False and an ``error`` naming the file and the fix, and ``report.ok`` is False.
    ``progress(done, total)`` counts bytes over all the steps verified.

    >>> report = verify("runs/exp1")  # doctest: +SKIP
    >>> report.ok, [(s.step, s.ok) for s in report.steps]  # doctest: +SKIP
    (False, [(100, True), (200, False)])
    >>> print(report.failed[0].error)  # doctest: +SKIP
    runs/exp1/step_000000200/tensors-00000.safetensors: checksum mismatch ...

    Args:
        path: A step or run directory (a path, a URL or a :class:`Storage`), or a folder
            of framework checkpoints.
        step: One step of a run; default every committed step.
        progress: ``progress(done, total)`` with the bytes verified over all the steps.

    Returns:
        A :class:`VerifyReport`: one :class:`StepVerifyReport` per step, ``ok`` and ``failed``.
        A damaged step does not raise.

    Raises:
        InvalidArgumentError: A foreign checkpoint (it has no checksums), or a ``step`` that
            contradicts a step directory.
        StepNotFoundError: Nothing to verify: no such path or step, a file, or a run without
            committed steps.
    """
    require_callable("progress", progress, "progress(done, total)")  # before any reading
    return verify_locations(verify_targets(path, step), progress)
