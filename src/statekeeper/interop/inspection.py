"""``inspect``: what a checkpoint holds, in any format statekeeper reads, as a typed report.

A statekeeper step is described from its verified manifest alone, without torch
(:func:`statekeeper.checkpoint.inspection.inspect_step`); a foreign checkpoint (torch.save,
safetensors, Hugging Face, Lightning, Accelerate, DCP) is read safely and its tensors and
values are described (:func:`statekeeper.interop.describe.describe`, which needs torch and
is imported only then).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeAlias

from statekeeper.checkpoint.inspection import StepReport, inspect_step
from statekeeper.checkpoint.location import PathOrStorage
from statekeeper.errors import InvalidArgumentError
from statekeeper.interop.detect import Format, foreign_format
from statekeeper.interop.frameworks import framework_entry, framework_folder

if TYPE_CHECKING:
    from statekeeper.interop.describe import Description

__all__ = ["ForeignReport", "inspect"]


def __getattr__(name: str) -> object:
    """``ForeignReport`` (the foreign report class) is loaded on first use: its module
    imports torch, which inspecting a statekeeper step never needs."""
    if name == "ForeignReport":
        from statekeeper.interop.describe import Description

        return Description
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    ForeignReport: TypeAlias = Description
    """What a foreign checkpoint holds: its files (name, bytes, role), tensors (key, shape,
    dtype, bytes, alias) and plain values."""


def inspect(target: PathOrStorage, *, step: int | None = None) -> StepReport | Description:
    """What a checkpoint holds, without loading it into a model.

    For a statekeeper run or step directory (a path, a URL such as
    ``s3://bucket/run/step_000000100``, or a ``Storage``), a :class:`StepReport` of the step
    (the newest one of a run unless ``step`` is given): its entries with their tensors (name,
    shape, dtype, bytes, file, aliases) and plain values, its metrics and totals. Only the
    manifest is read, and verified: use :func:`statekeeper.interop.verification.verify` to
    check the tensor data too. This path never imports torch.

    For a foreign checkpoint file or folder (torch.save, safetensors, Hugging Face,
    Lightning, Accelerate, DCP), a ``ForeignReport``
    (:class:`statekeeper.interop.describe.Description`): its files, tensors and values.
    Pickle-based files are opened with ``weights_only`` only.

    For a folder of framework checkpoints (a Lightning ``ModelCheckpoint`` directory, a
    Trainer output directory, an Accelerate project directory:
    :func:`~statekeeper.interop.frameworks.framework_folder`), its newest entry, or the one
    of ``step``, described as above.

    >>> report = inspect("runs/exp1")  # doctest: +SKIP
    >>> report.step, report.totals.tensors, report.metrics  # doctest: +SKIP
    (200, 12, {'loss': 0.75})
    >>> inspect("model.safetensors").tensors[0]  # doctest: +SKIP
    TensorInfo(key='embed.weight', shape=[6, 4], dtype='float32', bytes=96, alias_of=None)

    Args:
        target: A statekeeper run or step directory (a path, a URL or a :class:`Storage`),
            a foreign checkpoint file or folder, or a folder of framework checkpoints.
        step: The step of a run (or of a framework folder) to describe; default the newest.

    Returns:
        A :class:`StepReport` for a statekeeper step, a :class:`ForeignReport` for a foreign
        checkpoint.

    Raises:
        StepNotFoundError: The path does not exist or holds no such committed step.
        InvalidArgumentError: A file of no known format, or a ``step`` that does not apply.
        CorruptCheckpointError: A damaged manifest or foreign file.
        UnsupportedFormatError: A manifest this release cannot read.
        UnsafePickleError: A pickle that asks for more than tensors.
    """
    folder = framework_folder(target) if isinstance(target, str | os.PathLike) else None
    if folder is not None:  # a framework's folder: its newest entry (or the one of ``step``)
        entry, inner = framework_entry(folder, step)
        if entry.format is Format.STATEKEEPER:
            return inspect_step(entry.path, inner)
        target, step = entry.path, None
    foreign = foreign_format(target)
    if foreign is None:
        return inspect_step(target, step)
    path, fmt = foreign
    if step is not None:
        raise InvalidArgumentError(f"{path} is a {fmt} checkpoint, which has no steps")
    from statekeeper.interop.describe import describe  # foreign readers need torch

    return describe(path, fmt)
