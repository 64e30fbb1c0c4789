"""What a ``torch.save`` file may claim, checked around weights-only loading.

``torch.load`` trusts a file's claims in places; each check here is made before torch acts
on the claim, against the bytes really present:

- **zip archives** (the format since torch 1.6): torch checks a storage's record size
  against the numel the pickle claims, but reads each record by the size the zip directory
  claims, inflating compressed ones: a small deflated record can claim gigabytes.
  ``torch.save`` never compresses, so :func:`check_zip` refuses any compressed entry, any
  entry reaching past the archive and any name held twice (which entry torch would pick is
  then not ours to know);
- **legacy files** (before torch 1.6): torch allocates every storage at the size the pickle
  claims before reading a byte of it. :func:`check_legacy` loads the file once with storages
  on the ``meta`` device (nothing allocated, nothing read) and compares the claimed total
  with the file's size;
- **tuples nested deeply** make CPython's ``hash`` recurse in C while torch builds a dict
  with such a key: deep enough, the process crashes. :func:`tuple_depth` measures that
  nesting from the opcodes, before anything is unpickled;
- **what was loaded** (:func:`loaded_problem`): nesting beyond
  :data:`~statekeeper.format.jsondoc.MAX_DEPTH`, a container holding itself, shared
  containers that expand into more items than the file has bytes, and tensors that claim
  more bytes than both their storage and the file hold (a stride-0 view of 4 bytes claiming
  4 TiB, which any later ``contiguous()`` would allocate) are refused; what reads the state
  afterwards (flattening, describing, converting) walks it as a tree.
"""

from __future__ import annotations

import pickletools
import zipfile
from collections import Counter
from collections.abc import Callable
from typing import IO, Any

import torch

from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.jsondoc import MAX_DEPTH

__all__ = ["check_legacy", "check_zip", "loaded_problem", "tuple_depth"]

_TUPLES = {"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "FROZENSET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}


def check_zip(f: IO[bytes], size: int, where: str) -> bytes:
    """The pickle (``<archive>/data.pkl``) of the torch zip archive ``f`` of ``size`` bytes,
    after checking that every entry is stored uncompressed inside the archive, once."""
    try:
        with zipfile.ZipFile(f) as archive:
            infos = archive.infolist()
            twice = [n for n, c in Counter(i.filename for i in infos).items() if c > 1]
            if twice:
                raise CorruptCheckpointError(where, f"zip entry {twice[0]!r} is there twice")
            for info in infos:
                if info.compress_type != zipfile.ZIP_STORED:
                    raise CorruptCheckpointError(
                        where,
                        f"zip entry {info.filename!r} is compressed; torch.save never "
                        "compresses, so it is refused unread",
                    )
                if info.file_size != info.compress_size or (
                    info.header_offset + info.compress_size > size
                ):
                    raise CorruptCheckpointError(
                        where,
                        f"zip entry {info.filename!r} claims {info.file_size} bytes that the "
                        f"archive of {size} bytes does not hold",
                    )
            # torch reads the pickle of the archive named by the first entry
            pickle_name = infos[0].filename.split("/", 1)[0] + "/data.pkl" if infos else ""
            if pickle_name not in {i.filename for i in infos}:
                return b""  # torch.load says what is wrong
            return archive.read(pickle_name)
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as exc:
        if isinstance(exc, CorruptCheckpointError):
            raise
        raise CorruptCheckpointError(
            where, f"truncated or damaged torch.save file: a damaged zip archive ({exc})"
        ) from exc


def tuple_depth(stream: IO[bytes], pickles: int = 1) -> int:
    """How deeply tuples (and frozensets) nest in the next ``pickles`` pickles of ``stream``,
    from the opcodes alone. Stops quietly at anything malformed (``torch.load`` reports it).
    """
    deepest = 0
    try:
        for _ in range(pickles):
            deepest = max(deepest, _one_tuple_depth(stream))
    except Exception:  # pickletools raises ValueError, EOFError, struct.error, ...
        pass
    return deepest


def _specs() -> dict[str, tuple[int, bool, int, int]]:
    """Opcode -> (kind, pops to a MARK, values popped (besides), values pushed)."""
    specs: dict[str, tuple[int, bool, int, int]] = {}
    for op in pickletools.opcodes:
        before, after = op.stack_before, op.stack_after
        to_mark = pickletools.markobject in before
        count = before.index(pickletools.markobject) if to_mark else len(before)
        kind = _KINDS.get(op.name, _MARK if pickletools.markobject in after else _PLAIN)
        if kind == _PLAIN and not before and len(after) == 1:
            kind = _PUSH
        specs[op.code] = (kind, to_mark, count, len(after))
    return specs


_PLAIN, _PUSH, _MARK, _TUPLE, _PUT, _MEMOIZE, _GET, _DUP, _POP, _STOP = range(10)
_KINDS = {
    **dict.fromkeys(_TUPLES, _TUPLE), "EMPTY_TUPLE": _TUPLE, **dict.fromkeys(_PUTS, _PUT),
    "MEMOIZE": _MEMOIZE, **dict.fromkeys(_GETS, _GET), "DUP": _DUP, "POP": _POP, "STOP": _STOP,
}  # fmt: skip
_SPECS = _specs()


def _one_tuple_depth(stream: IO[bytes]) -> int:
    """Simulates the stack with, for each value, how deeply tuples nest in it (0 for
    anything else); a MARK's place is kept in ``marks``."""
    stack: list[int] = []
    marks: list[int] = []
    memo: dict[Any, int] = {}
    deepest = 0
    specs = _SPECS
    push = stack.append
    for op, arg, _ in pickletools.genops(stream):
        kind, to_mark, count, pushed = specs[op.code]
        if kind == _PUSH:  # the most frequent: a constant, a global, an empty container
            push(0)
            continue
        if kind == _PUT:
            memo[arg] = stack[-1]
            continue
        if kind == _GET:
            push(memo.get(arg, 0))
            continue
        if kind == _MEMOIZE:
            memo[len(memo)] = stack[-1]
            continue
        if kind == _DUP:
            push(stack[-1])
            continue
        if kind == _MARK:
            marks.append(len(stack))
            continue
        if kind == _POP:  # as pickle does: POP right after a MARK drops the MARK
            if marks and marks[-1] == len(stack):
                marks.pop()
            else:
                stack.pop()
            continue
        if kind == _STOP:
            break
        popped: list[int] = []
        if to_mark:
            at = marks.pop()
            popped = stack[at:]
            del stack[at:]
        if count:
            if len(stack) < count:
                raise ValueError("stack underflow")
            popped += stack[-count:]
            del stack[-count:]
        if kind == _TUPLE:
            depth = 1 + max(popped, default=0)
            deepest = max(deepest, depth)
            push(depth)
        else:
            stack.extend([0] * pushed)
    return deepest


def check_legacy(load: Callable[[], Any], size: int, where: str) -> None:
    """Refuse a legacy ``torch.save`` file whose storages claim more bytes than its ``size``.

    ``load`` runs ``torch.load`` on it; here it runs under a fake-tensor mode, in which
    torch's legacy loader makes every storage on the ``meta`` device and reads no data.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = load()
    claimed: dict[int, int] = {}
    for t in _tensors(fake):
        if t.layout is torch.strided:
            storage = t.untyped_storage()
            claimed[storage._cdata] = storage.nbytes()
    total = sum(claimed.values())
    if total > size:
        raise CorruptCheckpointError(
            where, f"its storages claim {total} bytes but the file holds only {size}"
        )


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in ``obj`` (dicts, lists, tuples, sets), each container visited once."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, dict | list | tuple | set | frozenset) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
    return out


def _children(item: Any) -> list[Any] | None:
    if isinstance(item, dict):
        return list(item.values())
    if isinstance(item, list | tuple | set | frozenset):
        return list(item)
    return None


def _tensor_problem(t: torch.Tensor, size: int) -> str | None:
    if t.layout is not torch.strided:
        return None
    claimed = t.numel() * t.element_size()
    held = t.untyped_storage().nbytes()
    if claimed > max(held, size):
        return (
            f"a tensor of shape {tuple(t.shape)} claims {claimed} bytes but its storage "
            f"holds {held} and the file {size} (a view that repeats its elements)"
        )
    return None


def loaded_problem(obj: Any, size: int) -> str | None:
    """Why the loaded ``obj`` (from ``size`` bytes) cannot be walked safely as a tree, or
    None. Iterative: each container is entered once, however often it is shared."""
    expanded: dict[int, int] = {}  # id -> items in the container once expanded as a tree
    checked: set[int] = set()
    kids = _children(obj)
    if kids is None:
        return _tensor_problem(obj, size) if isinstance(obj, torch.Tensor) else None
    frames: list[list[Any]] = [[obj, iter(kids), 1]]
    on_path = {id(obj)}
    while frames:
        frame = frames[-1]
        for kid in frame[1]:
            sub = _children(kid)
            if sub is None:
                frame[2] += 1
                if isinstance(kid, torch.Tensor) and id(kid) not in checked:
                    checked.add(id(kid))
                    problem = _tensor_problem(kid, size)
                    if problem is not None:
                        return problem
            elif id(kid) in expanded:
                frame[2] += expanded[id(kid)]
            elif id(kid) in on_path:
                return "a container holds itself"
            elif len(frames) >= MAX_DEPTH:
                return f"containers are nested deeper than {MAX_DEPTH} levels"
            else:
                on_path.add(id(kid))
                frames.append([kid, iter(sub), 1])
                break
        else:
            frames.pop()
            on_path.discard(id(frame[0]))
            expanded[id(frame[0])] = frame[2]
            if frame[2] > max(size, 1024):
                return (
                    f"shared containers expand into {frame[2]} items, more than the "
                    f"{size} bytes of the file could hold"
                )
            if frames:
                frames[-1][2] += frame[2]
    return None
