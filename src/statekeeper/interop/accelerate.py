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

from collections.abc import Callable
from pathlib import Path
from typing import Any

from statekeeper.errors import CorruptCheckpointError
from statekeeper.interop.pickled import load_torch_file, numpy_globals
from statekeeper.interop.safetensors_files import read_index, read_safetensors

__all__ = ["accelerate_files", "read_accelerate"]

Progress = Callable[[int, int], None]
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


def accelerate_files(folder: Path) -> dict[str, Path]:
    """Entry name -> file, for every checkpoint file of the folder (shards via their index)."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    sharded: set[str] = set()
    for name in names:
        if name.endswith(".index.json"):
            prefix = name.split(".", 1)[0]
            sharded |= {n for n in names if n.startswith(prefix + "-") and n != name}
    out: dict[str, Path] = {}
    for name in names:
        if name in sharded or not name.endswith(_SUFFIXES):
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
    total = sum(p.stat().st_size for p in files.values())
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
        done += file.stat().st_size
        if progress is not None:
            progress(done, total)
    return state
