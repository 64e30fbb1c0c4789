"""``inspect``: what a checkpoint holds, in any format statekeeper reads, as a typed report.

A statekeeper step is described from its verified manifest alone, without torch
(:func:`statekeeper.catalog.inspection.inspect_step`); a foreign checkpoint (torch.save,
safetensors, Hugging Face, Lightning, Accelerate, DCP) is read safely and its tensors and
values are described (:func:`statekeeper.interop.describe.describe`, which needs torch and
is imported only then).
"""

from __future__ import annotations

import os

from statekeeper.catalog.detect import Format, foreign_format
from statekeeper.catalog.frameworks import framework_entry, framework_folder
from statekeeper.catalog.inspection import InspectReport, inspect_step
from statekeeper.catalog.location import PathOrStorage
from statekeeper.errors import InvalidArgumentError
from statekeeper.interop.foreign_report import ForeignReport

__all__ = ["ForeignReport", "inspect"]


def inspect(path: PathOrStorage, *, step: int | None = None) -> InspectReport | ForeignReport:
    """What a checkpoint holds, without loading it into a model.

    For a statekeeper run or step directory (a path, a URL such as
    ``s3://bucket/run/step_000000100``, or a ``Storage``), a :class:`InspectReport` of the step
    (the newest one of a run unless ``step`` is given): its entries with their tensors (name,
    shape, dtype, bytes, file, aliases) and plain values, its metrics and totals. Only the
    manifest is read, and verified: use :func:`statekeeper.catalog.verify.verify` to
    check the tensor data too. This path never imports torch.

    For a foreign checkpoint file or folder (torch.save, safetensors, Hugging Face,
    Lightning, Accelerate, DCP), a :class:`ForeignReport`: its files, tensors and values
    (the same :class:`~statekeeper.catalog.inspection.TensorRow` and
    :class:`~statekeeper.catalog.inspection.ValueRow` rows).
    Pickle-based files are opened with ``weights_only`` only.

    For a folder of framework checkpoints (a Lightning ``ModelCheckpoint`` directory, a
    Trainer output directory, an Accelerate project directory:
    :func:`~statekeeper.catalog.frameworks.framework_folder`), its newest entry, or the one
    of ``step``, described as above.

    >>> report = inspect("runs/exp1")  # doctest: +SKIP
    >>> report.step, report.totals.tensors, report.metrics  # doctest: +SKIP
    (200, 12, {'loss': 0.75})
    >>> row = inspect("model.safetensors").tensors[0]  # doctest: +SKIP
    >>> row.key, row.shape, row.dtype, row.bytes, row.alias_of  # doctest: +SKIP
    ('embed.weight', (6, 4), 'float32', 96, None)

    Args:
        path: A statekeeper run or step directory (a path, a URL or a :class:`Storage`),
            a foreign checkpoint file or folder, or a folder of framework checkpoints.
        step: The step of a run (or of a framework folder) to describe; default the newest.

    Returns:
        A :class:`InspectReport` for a statekeeper step, a :class:`ForeignReport` for a foreign
        checkpoint.

    Raises:
        StepNotFoundError: The path does not exist or holds no such committed step.
        InvalidArgumentError: A file of no known format, or a ``step`` that does not apply.
        CorruptCheckpointError: A damaged manifest or foreign file.
        UnsupportedFormatError: A manifest this release cannot read.
        UnsafePickleError: A pickle that asks for more than tensors.
    """
    folder = framework_folder(path) if isinstance(path, str | os.PathLike) else None
    if folder is not None:  # a framework's folder: its newest entry (or the one of ``step``)
        entry, inner = framework_entry(folder, step)
        if entry.format is Format.STATEKEEPER:
            return inspect_step(entry.path, inner)
        path, step = entry.path, None
    foreign = foreign_format(path)
    if foreign is None:
        return inspect_step(path, step)
    file, fmt = foreign
    if step is not None:
        raise InvalidArgumentError(f"{file} is a {fmt} checkpoint, which has no steps")
    from statekeeper.interop.describe import describe  # foreign readers need torch

    return describe(file, fmt)
