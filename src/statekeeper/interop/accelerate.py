"""Accelerate ``save_state`` folders: one entry per file, each read safely.

``Accelerator.save_state(dir)`` writes the prepared models' weights (``model.safetensors``,
``model_1.safetensors``, ... or ``pytorch_model.bin`` without safe serialization, possibly
sharded with an index), ``optimizer.bin``, ``scheduler.bin``, ``sampler.bin``,
``dl_state_dict.bin``, ``scaler.pt``, ``random_states_<process>.pkl`` and
``custom_checkpoint_<n>.pkl``, all but the safetensors files written by ``torch.save``.
Each becomes one entry of the result, named after the file without its suffix
(``pytorch_model`` is called ``model`` like its safetensors twin). The RNG files hold numpy's
generator state, so only they are loaded with numpy's array constructors allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from statekeeper.catalog.foreign_files import size_of
from statekeeper.errors import CorruptCheckpointError
from statekeeper.interop.pickled import load_torch_file, numpy_globals
from statekeeper.interop.safetensors_files import read_index, read_safetensors
from statekeeper.progress import Progress

__all__ = ["accelerate_files", "read_accelerate"]

_SUFFIXES = (".safetensors.index.json", ".bin.index.json", ".safetensors", ".bin", ".pt", ".pkl")


def _entry(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            stem = name.removesuffix(suffix)
            return (
                "model" + stem.removeprefix("pytorch_model")
                if stem.startswith("pytorch_model")
                else stem
            )
    return name


def _shard_of(name: str, prefixes: set[str]) -> bool:
    """Whether ``name`` is ``<prefix>-...`` for one of ``prefixes`` (linear in its length)."""
    return any(name[:i] in prefixes for i, c in enumerate(name) if c == "-")


def accelerate_files(folder: Path) -> dict[str, Path]:
    """Entry name -> file, for every checkpoint file of the folder (shards via their index).

    Every name but a directory's counts, whatever it is: a FIFO or a link to a device is
    refused when it is opened, never skipped (which would drop an entry silently).
    """
    names = sorted(p.name for p in folder.iterdir() if not p.is_dir())
    prefixes = {n.split(".", 1)[0] for n in names if n.endswith(".index.json")}
    out: dict[str, Path] = {}
    for name in names:
        if not name.endswith(_SUFFIXES):
            continue
        if not name.endswith(".index.json") and _shard_of(name, prefixes):
            continue
        entry = _entry(name)
        if entry in out:
            raise CorruptCheckpointError(
                str(folder / name), f"a second file for entry {entry!r} ({out[entry].name})"
            )
        out[entry] = folder / name
    return out


def read_accelerate(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """``{"model": {...}, "optimizer": {...}, "scheduler": {...}, "random_states_0": ...}``."""
    folder = Path(path)
    files = accelerate_files(folder)
    sizes = {entry: size_of(file) for entry, file in files.items()}
    total = sum(sizes.values())
    done = 0
    state: dict[str, Any] = {}
    for entry, file in files.items():
        if file.name.endswith(".index.json"):
            state[entry] = read_index(file)
        elif file.name.endswith(".safetensors"):
            state[entry] = read_safetensors(file)
        elif file.name.startswith("random_states_"):
            state[entry] = load_torch_file(file, allow=numpy_globals())
        else:
            state[entry] = load_torch_file(file)
        done += sizes[entry]
        if progress is not None:
            progress(done, total)
    return state
