"""``torch.save`` files opened the only safe way: ``torch.load(weights_only=True)``.

A file that needs anything more is refused with :class:`UnsafePickleError`, which lists the
globals the file asks for. They are found by disassembling the pickle (see
:mod:`statekeeper.interop.opcodes`), never by running it. A file that is not a complete
``torch.save`` file (truncated, damaged) is a :class:`CorruptCheckpointError` naming it, and
so is one that claims more than it holds (see :mod:`statekeeper.interop.torch_checks`: zip
entries, legacy storages, nesting, views). Files are opened as regular files only
(:mod:`statekeeper.catalog.foreign_files`).
"""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO

import torch

from statekeeper.catalog.foreign_files import ZIP_MAGIC, is_torch_file, open_file
from statekeeper.errors import CorruptCheckpointError, UnsafePickleError
from statekeeper.format.jsondoc import MAX_DEPTH
from statekeeper.interop.opcodes import scan_stream
from statekeeper.interop.torch_checks import check_legacy, check_zip, loaded_problem, tuple_depth

__all__ = ["ZIP_MAGIC", "is_torch_file", "load_torch_bytes", "load_torch_file", "numpy_globals"]


def numpy_globals() -> list[Any]:
    """The numpy constructors an ndarray pickle needs, as torch documents for weights_only.

    Used only for Accelerate's ``random_states_*.pkl`` (numpy's RNG state is an array).
    Arrays are rebuilt from raw bytes; an object array's items still go through the
    weights-only unpickler, so nothing else becomes importable.
    """
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    dtypes = [type(np.dtype(t)) for t in ("uint32", "int64", "float64", "uint8", "bool")]
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, *dtypes]


def _pickle_globals(source: Path | bytes) -> tuple[list[str], str | None]:
    """Every global the file's pickles name (static: nothing is run), and why the scan
    stopped early (None when it read everything it should)."""
    if isinstance(source, bytes):
        return _globals_in(io.BytesIO(source))
    with os.fdopen(open_file(source), "rb") as f:
        return _globals_in(f)


def _globals_in(f: BinaryIO) -> tuple[list[str], str | None]:
    if zipfile.is_zipfile(f):
        try:
            with zipfile.ZipFile(f) as archive:
                names = [n for n in archive.namelist() if n.endswith("data.pkl")]
                if not names:
                    return [], "a zip archive without data.pkl"
                return scan_stream(io.BytesIO(archive.read(names[0]))), None
        except (ValueError, zipfile.BadZipFile, OSError) as exc:
            return [], str(exc)
    f.seek(0)
    if f.read(4) == ZIP_MAGIC:
        return [], "the zip archive is incomplete (no central directory)"
    found: list[str] = []
    # the legacy format: pickles of the magic number, protocol, sys info, then the object
    size = f.seek(0, io.SEEK_END)
    f.seek(0)
    for _ in range(4):
        if f.tell() == size:
            break
        try:
            found += [g for g in scan_stream(f) if g not in found]
        except ValueError as exc:
            return found, str(exc)
    return found, None


def refused_globals(path: Path, allow: Sequence[Any] = ()) -> list[str]:
    """The globals a ``torch.save`` file names that ``torch.load(weights_only=True)`` would
    refuse (a static scan of its pickles: nothing is run). Empty: the file opens safely, as
    ``read`` and ``inspect`` open it."""
    asked, _ = _pickle_globals(path)
    allowed = _allowed(allow)
    return [g for g in asked if g not in allowed]


def _allowed(extra: Sequence[Any]) -> set[str]:
    from torch import _weights_only_unpickler as wu

    names = set(wu._get_allowed_globals()) | set(wu._get_user_allowed_globals())  # type: ignore[no-untyped-call]
    return names | {f"{g.__module__}.{g.__qualname__}" for g in extra}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for marker in ("WeightsUnpickler error: ", "Unsupported operand"):
        if marker in text:
            text = text[text.index(marker) :].removeprefix("WeightsUnpickler error: ")
    return (text.splitlines() or [type(exc).__name__])[0][:300].rstrip(".")


def _explain(
    path: Path, exc: BaseException, extra: Sequence[Any], data: bytes | None = None
) -> Exception:
    asked, incomplete = _pickle_globals(path if data is None else data)
    refused = [g for g in asked if g not in _allowed(extra)]
    if refused:  # refused whether or not the rest of the file is intact
        return UnsafePickleError(str(path), refused)
    if incomplete is not None:
        return CorruptCheckpointError(
            str(path), f"truncated or damaged torch.save file: {incomplete}"
        )
    if type(exc).__name__ == "UnpicklingError":
        return UnsafePickleError(str(path), [], _first_line(exc))
    return CorruptCheckpointError(
        str(path), f"truncated or damaged torch.save file: {_first_line(exc)}"
    )


def load_torch_file(
    path: str | Path, *, allow: Sequence[Any] = (), listed_in: str | None = None
) -> Any:
    """The object in a ``torch.save`` file, tensors on the CPU (memory-mapped when zipped).

    Only ``torch.load(weights_only=True)`` is used; ``allow`` adds classes or functions to
    its allowlist for this call (statekeeper passes only :func:`numpy_globals`).
    ``listed_in`` names the document that lists the file (a missing file is then corrupt).
    """
    p = Path(path)
    with os.fdopen(open_file(p, listed_in), "rb") as f:
        return _load(p, f, os.fstat(f.fileno()).st_size, allow, None)


def load_torch_bytes(data: bytes, where: str) -> Any:
    """The object in ``torch.save`` bytes (one DCP item); ``where`` names it in errors."""
    return _load(Path(where), io.BytesIO(data), len(data), (), data)


def _load(p: Path, f: IO[bytes], size: int, allow: Sequence[Any], data: bytes | None) -> Any:
    """``torch.load`` of ``f`` (``size`` bytes; ``data`` when they are in memory), after
    and around the checks of :mod:`statekeeper.interop.torch_checks`."""
    where = str(p)
    zipped = f.read(4) == ZIP_MAGIC  # the test torch.load itself makes
    f.seek(0)
    if zipped:
        depth = tuple_depth(io.BytesIO(check_zip(f, size, where)))
    else:
        depth = tuple_depth(f, pickles=5)  # magic, protocol, system info, object, storage keys
    if depth > MAX_DEPTH:
        raise CorruptCheckpointError(
            where, f"tuples nest {depth} levels deep, more than the {MAX_DEPTH} allowed"
        )
    mapped = zipped and data is None

    def load() -> Any:
        f.seek(0)
        with torch.serialization.safe_globals(list(allow)), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(p if mapped else f, map_location="cpu", weights_only=True,
                              mmap=mapped)  # fmt: skip

    try:
        if not zipped:
            check_legacy(load, size, where)
        obj = load()
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
        raise _explain(p, exc, allow, data) from exc
    problem = loaded_problem(obj, size)
    if problem is not None:
        raise CorruptCheckpointError(where, problem)
    return obj
