"""Which format a path holds, from names and a few leading bytes (nothing is loaded)."""

from __future__ import annotations

import os
import re
from enum import StrEnum
from pathlib import Path

from statekeeper.catalog.foreign_files import is_torch_file, size_of
from statekeeper.catalog.location import is_step_dir
from statekeeper.catalog.naming import EntryKind, parse_entry
from statekeeper.catalog.paths import checked_path
from statekeeper.errors import CorruptCheckpointError, InvalidArgumentError

__all__ = ["ACCELERATE_FILES", "Format", "detect", "foreign_format", "is_accelerate_file"]


class Format(StrEnum):
    """A checkpoint format statekeeper reads."""

    STATEKEEPER = "statekeeper"  # a run or step directory
    SAFETENSORS = "safetensors"  # one .safetensors file
    HUGGINGFACE = "huggingface"  # an index (.index.json) or a folder of model weights
    TORCH = "torch"  # a torch.save file: .pt, .pth, .bin (zip or legacy)
    LIGHTNING = "lightning"  # a Lightning .ckpt (a torch.save file)
    ACCELERATE = "accelerate"  # an Accelerator.save_state folder
    DCP = "dcp"  # a torch.distributed.checkpoint folder


ACCELERATE_FILES = re.compile(
    r"(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin|random_states_\d+\.pkl|"
    r"scaler\.pt|custom_checkpoint_\d+\.pkl"
)
"""Files that only an Accelerate ``save_state`` folder holds besides the model weights."""

_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".tar")


def is_accelerate_file(name: str) -> bool:
    return ACCELERATE_FILES.fullmatch(name) is not None


def _is_statekeeper_dir(path: Path) -> bool:
    """A step (:func:`~statekeeper.catalog.location.is_step_dir`: a ``manifest.json`` of
    any kind, so that a FIFO or a link in its place is refused by statekeeper's own reader)
    or a run directory."""
    if is_step_dir(path) or is_step_dir(path.resolve()):
        return True
    for child in path.iterdir():
        parsed = parse_entry(child.name)
        if parsed is not None and parsed.kind is EntryKind.COMMITTED:
            return True
    return False


def _detect_dir(path: Path) -> Format | None:
    if _is_statekeeper_dir(path):
        return Format.STATEKEEPER
    names = {child.name for child in path.iterdir()}
    if ".metadata" in names and any(n.endswith(".distcp") for n in names):
        return Format.DCP
    if any(is_accelerate_file(n) for n in names):
        return Format.ACCELERATE
    if any(n.endswith((".index.json", ".safetensors")) or n == "pytorch_model.bin" for n in names):
        return Format.HUGGINGFACE
    return None


def _detect_file(path: Path) -> Format:
    name = path.name
    if name.endswith(".index.json"):
        return Format.HUGGINGFACE
    if name.endswith(".safetensors"):
        return Format.SAFETENSORS
    if is_torch_file(path):
        return Format.LIGHTNING if name.endswith(".ckpt") else Format.TORCH
    if name.endswith(_TORCH_SUFFIXES):
        raise CorruptCheckpointError(
            str(path), "does not start like a torch.save file (zip or pickle)"
        )
    raise InvalidArgumentError(
        f"{path}: not a checkpoint format statekeeper reads (statekeeper run or step "
        "directories, .safetensors, *.index.json, torch.save files .pt/.pth/.bin, Lightning "
        ".ckpt, Accelerate save_state folders, DCP folders)"
    )


def detect(path: str | os.PathLike[str]) -> Format | None:
    """The format of a local ``path``; None for a directory that holds none of them.

    A path that is neither a directory nor (through links) a regular file, such as a FIFO
    or a device, is a ``CorruptCheckpointError``; nothing is opened before that is known.
    """
    p = Path(path)
    if p.is_dir():
        return _detect_dir(p)
    if not os.path.lexists(p):
        raise FileNotFoundError(f"{p}: no such file or directory")
    size_of(p)  # refuses what is not a regular file (a broken link: FileNotFoundError)
    return _detect_file(p)


def foreign_format(target: object) -> tuple[str, Format] | None:
    """``(path, format)`` of a foreign ``target``; None when statekeeper's own reader applies.

    Only existing local paths can be foreign: storages, URLs (``scheme://``), missing paths
    and directories that are no other format go to the statekeeper reader, which gives its
    usual errors.
    """
    if not isinstance(target, str | os.PathLike):
        return None
    text = os.fspath(target)
    if "://" in str(text):
        return None
    text = checked_path(target)  # an empty or too long path: named, not a bare OSError
    if not Path(text).exists():
        return None
    found = detect(text)
    return None if found is None or found is Format.STATEKEEPER else (text, found)
