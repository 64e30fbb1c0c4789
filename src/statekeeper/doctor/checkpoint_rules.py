"""The doctor on a checkpoint on disk: ``check_checkpoint(path)``.

A statekeeper step or run directory (the newest committed step) is read through its
verified manifest only, no tensor is loaded: wrapper prefixes in tensor names (SK007
WARNING) and tensors stored once and re-tied on load (SK007 INFO) are reported.

Any other file is identified by its first bytes and, for a zip archive, by its member
names; nothing in it is ever unpickled or executed. A ``torch.save`` file (a zip holding
``data.pkl``, or a raw pickle starting with the PROTO opcode) gets the verdict ``read`` and
``inspect`` act on: SK008 INFO when every global its pickles name is one weights-only
loading allows, SK008 ERROR naming the others when not; a
``.safetensors`` file is safe (SK008 INFO), and its tensor names are checked for wrapper
prefixes. A directory that holds no statekeeper step but such files has each of them checked.
"""

from __future__ import annotations

import math
import mmap
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

from statekeeper.catalog.location import locate
from statekeeper.checkpoint.reader import read_manifest
from statekeeper.doctor.finding import Finding, Report, Severity
from statekeeper.doctor.rules._probe import module_path
from statekeeper.doctor.rules.pickle_values import PickleValues
from statekeeper.doctor.rules.shared_storage import SharedStorage, wrapper_prefixes
from statekeeper.doctor.rules.shared_storage import wrapper_text as _wrapper_text
from statekeeper.errors import StepNotFoundError
from statekeeper.format.dtypes import ITEMSIZE
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.format.safetensors_header import read_header
from statekeeper.interop.pickled import numpy_globals, refused_globals
from statekeeper.storage.files import regular_size

__all__ = ["check_checkpoint"]

SK007, SK008 = SharedStorage.id, PickleValues.id
RULES = ((SK007, SharedStorage.summary), (SK008, PickleValues.summary))
FOREIGN_SUFFIXES = frozenset({".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".safetensors"})
SAFE = "safe format"
PICKLE_PROBLEM = "this file is a pickle that weights_only loading refuses: loading it runs code"
WEIGHTS_ONLY = (
    "a torch.save pickle holding only tensors and plain values: torch.load with weights_only=True "
    "opens it without running code, as statekeeper read and inspect do"
)
WEIGHTS_ONLY_FIX = (
    "nothing needed with weights_only=True (torch >= 2.6's default); older torch or "
    "weights_only=False would unpickle it fully, so prefer safetensors or statekeeper.save"
)
PICKLE_FIX = (
    "convert it once in a trusted environment and store it with statekeeper.save "
    "(safetensors + JSON); never torch.load a file whose origin you do not trust"
)


def check_checkpoint(path: str, step: int | None = None) -> Report:
    """Diagnose a checkpoint on disk without running anything from it.

    Raises :class:`StepNotFoundError` when ``path`` does not exist, or is a directory that
    holds neither a statekeeper step nor checkpoint files.
    """
    start = time.perf_counter()
    p = Path(path)
    if not p.exists():
        raise StepNotFoundError(f"{path} does not exist; pass a checkpoint file or directory")
    if p.is_file() and p.name == MANIFEST:
        p = p.parent
    skipped: tuple[tuple[str, str], ...] = ()
    if p.is_dir():
        try:
            findings = list(_statekeeper(str(p), step))
        except StepNotFoundError:
            files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in FOREIGN_SUFFIXES)
            if not files:
                raise
            findings = [f for file in files for f in _foreign(file, str(file.relative_to(p)))]
    else:
        findings = list(_foreign(p, p.name))
        if not any(f.problem.startswith(SAFE) for f in findings):
            skipped = ((SK007, "its tensor names cannot be read without running it"),)
    return Report(path, tuple(findings), RULES, skipped, time.perf_counter() - start)


def _statekeeper(path: str, step: int | None) -> Iterator[Finding]:
    manifest = read_manifest(locate(path, step))
    yield from _prefixes(list(manifest.tensors) + list(manifest.aliases))
    yield from _aliases(manifest)


def _aliases(manifest: Manifest) -> Iterator[Finding]:
    for name, alias in sorted(manifest.aliases.items()):
        base = manifest.tensors.get(alias.base)
        size = None if base is None else ITEMSIZE.get(base.dtype)
        entry, _, key = name.partition("/")
        yield Finding(
            SK007, Severity.INFO, f"{entry}/{module_path(key, '<root>')}" if key else entry,
            f"shares storage with {alias.base}: stored once, re-tied on load", "nothing to do",
            tensor=name, shape=alias.shape,
            bytes=None if size is None else math.prod(alias.shape) * size,
        )  # fmt: skip


def _key_of(rest: str) -> str:
    """The parameter-like part of a tensor name after its entry (``state/m/a.b/exp_avg``)."""
    segments = rest.split("/")
    dotted = [s for s in segments if "." in s]
    return dotted[-1] if dotted else segments[-1]


def _prefixes(names: list[str], what: str = "tensor names") -> Iterator[Finding]:
    """One SK007 warning per (entry, wrapper prefix); names are ``entry/key`` or bare keys."""
    by_entry: dict[str, list[str]] = {}
    for name in names:
        entry, sep, rest = name.partition("/")
        by_entry.setdefault(entry if sep else "", []).append(_key_of(rest) if sep else name)
    for entry, keys in by_entry.items():
        for prefix, count in wrapper_prefixes(keys).items():
            problem, fix = _wrapper_text(prefix, count, what)
            fix += (
                "; to use this file, strip the prefix from the keys once "
                "(torch.nn.modules.utils.consume_prefix_in_state_dict_if_present) and re-save"
            )
            yield Finding(SK007, Severity.WARNING, entry or "<file>", problem, fix)


def _foreign(path: Path, where: str) -> Iterator[Finding]:
    size = regular_size(path, follow=True)  # a FIFO or device is refused, never opened
    with path.open("rb") as f:
        head = f.read(16)
    kind = None
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                pickles = [n for n in archive.namelist() if n.endswith(".pkl")]
        except (zipfile.BadZipFile, OSError):
            pickles = []
        kind = f"a torch.save zip archive holding {pickles[0]}" if pickles else None
    elif len(head) >= 2 and head[0] == 0x80 and 1 <= head[1] <= 5:
        kind = f"pickle protocol {head[1]}, e.g. a legacy torch.save file"
    if kind is not None:
        yield _pickle_finding(path, where, kind, size)
        return
    names = _safetensors_names(path, head)
    if names is not None:
        yield Finding(
            SK008, Severity.INFO, where,
            f"{SAFE}: safetensors ({len(names)} tensors), loading it runs no code",
            "nothing to do", bytes=size,
        )  # fmt: skip
        yield from (
            Finding(f.rule, f.severity, where, f.problem, f.fix) for f in _prefixes(names)
        )  # fmt: skip
        return
    yield Finding(
        SK008, Severity.WARNING, where,
        "neither a statekeeper checkpoint, a safetensors file nor a recognizable pickle: "
        "the doctor cannot tell whether loading it runs code",
        "store checkpoints with statekeeper.save, or tensors as .safetensors", bytes=size,
    )  # fmt: skip


def _pickle_finding(path: Path, where: str, kind: str, size: int) -> Finding:
    """The verdict ``read`` and ``inspect`` act on: a pickle whose globals weights_only
    loading allows is opened safely (INFO); one that asks for more is an ERROR naming them."""
    extra = numpy_globals() if path.name.startswith("random_states_") else ()
    refused = refused_globals(path, extra)
    if not refused:
        return Finding(
            SK008, Severity.INFO, where, f"{WEIGHTS_ONLY} ({kind})", WEIGHTS_ONLY_FIX, bytes=size
        )
    return Finding(
        SK008, Severity.ERROR, where,
        f"{PICKLE_PROBLEM} ({kind}; it asks for {', '.join(refused[:5])})",
        PICKLE_FIX, bytes=size,
    )  # fmt: skip


def _safetensors_names(path: Path, head: bytes) -> list[str] | None:
    """The tensor names of a safetensors file, or None if it is not a well-formed one."""
    if len(head) < 9 or head[8:9] != b"{":
        return None
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return list(read_header(view).entries)
        except ValueError:
            return None
        finally:
            view.release()
