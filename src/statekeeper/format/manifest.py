"""``manifest.json``: the record of one committed step (format version 1).

The manifest is ASCII JSON: one top-level member per line, the entries of ``files``,
``tensors`` and ``aliases`` one per line, every value compact (no spaces), a trailing
newline. Its members, in this order: ``format``, ``version``, ``step``, ``created``,
``library``, (only when recorded: ``origin``), ``metrics``,
``files``, ``tensors``, ``aliases``, (only when the save reused files of an earlier step:
``reused``), (version 2, sharded steps only: ``sharded`` and
``ranks``, see :mod:`statekeeper.format.sharding`), ``state`` and last
``manifest_checksum``: the checksum
of the file's own bytes with the 32 hex digits of that member replaced by ``0``. So any
change to the manifest, even one that stays valid JSON, is detected. See ``docs/format.md``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from statekeeper.errors import CorruptCheckpointError, UnsupportedFormatError
from statekeeper.format.aliases import MAX_ALIAS_AMPLIFICATION, Alias, alias_problem
from statekeeper.format.checksum import ALGORITHM, checksum
from statekeeper.format.jsondoc import depth_problem
from statekeeper.format.malformed import FormatError, as_list, as_object, corrupt, member
from statekeeper.format.manifest_parse import (
    TensorRecord,
    TensorRecords,
    parse_manifest_json,
    record_problem,
)
from statekeeper.format.sharding import Sharding
from statekeeper.format.values import Json
from statekeeper.storage.files import check_name

__all__ = [
    "FORMAT",
    "MANIFEST",
    "SHARDED_VERSION",
    "VERSION",
    "FileRecord",
    "Manifest",
    "TensorRecord",
]

FORMAT = "statekeeper"
VERSION = 1
SHARDED_VERSION = 2  # version 1 plus ``sharded`` and ``ranks``: see format/sharding.py
MANIFEST = "manifest.json"
_CHECKSUM_KEY = '"manifest_checksum":"'
_ZERO = "0" * 32


@dataclass(frozen=True)
class FileRecord:
    size: int
    checksum: str


@dataclass(frozen=True)
class Manifest:
    step: int
    created: str
    library: dict[str, str]
    metrics: dict[str, Json]
    files: dict[str, FileRecord]
    tensors: dict[str, TensorRecord]
    aliases: dict[str, Alias]
    state: Json
    sharding: Sharding | None = None
    origin: dict[str, Json] = field(default_factory=dict)
    """Where the step was written (host, command line, world size, devices, git state):
    informational, written only when not empty (the golden files pin it empty)."""
    reused: dict[str, str] = field(default_factory=dict)
    """File of this step -> ``"<entry>/<file>"`` of the earlier step whose identical bytes
    it reuses (linked or copied by the store, not written by this save). Written only when
    not empty, so a manifest without reuse is byte for byte what it always was."""

    def written_bytes(self) -> int:
        """Bytes of tensor files this step's save wrote (the others it reused)."""
        return sum(r.size for n, r in self.files.items() if n not in self.reused)

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION if self.sharding is None else SHARDED_VERSION,
            "step": self.step,
            "created": self.created,
            "library": dict(sorted(self.library.items())),
            **({"origin": dict(sorted(self.origin.items()))} if self.origin else {}),
            "metrics": dict(sorted(self.metrics.items())),
            "files": {
                n: {"size": r.size, "checksum": r.checksum} for n, r in sorted(self.files.items())
            },
            "tensors": _tensor_lines(self.tensors),
            "aliases": {n: a.to_json() for n, a in sorted(self.aliases.items())},
            **({"reused": dict(sorted(self.reused.items()))} if self.reused else {}),
            **(self.sharding.to_json() if self.sharding is not None else {}),
            "state": self.state,
            "manifest_checksum": f"{ALGORITHM}:{_ZERO}",
        }
        # one text and one buffer, the digest patched in place: a manifest of 500,000
        # tensors is 60 MB, and every copy of it was part of the save's peak memory
        data = bytearray(_dump(body), "ascii")
        del body  # its encoded lines
        digest = checksum(data).split(":", 1)[1]
        cut = data.rindex(_CHECKSUM_KEY.encode()) + len(_CHECKSUM_KEY) + len(ALGORITHM) + 1
        data[cut : cut + 32] = digest.encode("ascii")
        return bytes(data)

    @classmethod
    def from_bytes(cls, path: str, data: bytes | bytearray) -> Manifest:
        """Parse and verify; raises CorruptCheckpointError or UnsupportedFormatError naming path."""
        try:
            text = data.decode("ascii")
            body = parse_manifest_json(text)
        except (UnicodeDecodeError, FormatError) as exc:
            raise corrupt(path, exc, "manifest is not valid JSON ({})") from exc
        if not isinstance(body, dict):
            raise CorruptCheckpointError(path, "manifest is not a JSON object")
        if body.get("format") != FORMAT:
            raise CorruptCheckpointError(
                path, f"not a statekeeper manifest (format={body.get('format')!r})"
            )
        version = body.get("version")
        if type(version) is not int or version not in (VERSION, SHARDED_VERSION):
            raise UnsupportedFormatError(path, version, [VERSION, SHARDED_VERSION])
        _verify_self_checksum(path, text, body)
        try:
            manifest = cls._from_body(body, version)
        except FormatError as exc:
            raise corrupt(path, exc, "manifest is malformed ({})") from exc
        for name in manifest.files:  # opened by name: one plain component, nothing else
            check_name(path, name)
        stray = sorted(set(manifest.reused) - set(manifest.files))
        if stray:
            raise CorruptCheckpointError(path, f"manifest marks unknown files reused: {stray}")
        for part, value in (("metrics", manifest.metrics), ("origin", manifest.origin)):
            problem = depth_problem(value)
            if problem is not None:
                raise CorruptCheckpointError(path, f"manifest {part} are {problem}")
        if manifest.aliases:
            _check_aliases(path, manifest)
        return manifest

    @classmethod
    def _from_body(cls, body: dict[str, Any], version: int) -> Manifest:
        """The manifest that the checked JSON ``body`` holds; ``FormatError`` naming the
        first member that does not have its form."""

        def at(obj: dict[str, Any], key: str, what: str = "manifest") -> Any:
            return member(obj, key, what)

        def file(name: str, value: object) -> FileRecord:
            what = f"file {name!r}"
            r = as_object(value, what)
            return FileRecord(_int(at(r, "size", what)), str(at(r, "checksum", what)))

        def alias(name: str, value: object) -> Alias:
            what = f"alias {name!r}"
            a = as_object(value, what)
            shape, stride = (as_list(at(a, k, what), f"{what} {k}") for k in ("shape", "stride"))
            offset = _int(at(a, "offset", what))
            return Alias(str(at(a, "base", what)), offset, _ints(shape), _ints(stride))

        return cls(
            step=_int(at(body, "step")),
            created=str(at(body, "created")),
            library={str(k): str(v) for k, v in as_object(at(body, "library"), "library").items()},
            metrics=dict(as_object(at(body, "metrics"), "metrics")),
            files={n: file(n, r) for n, r in as_object(at(body, "files"), "files").items()},
            tensors=_tensor_records(at(body, "tensors")),
            aliases={n: alias(n, a) for n, a in as_object(at(body, "aliases"), "aliases").items()},
            state=at(body, "state"),
            sharding=Sharding.from_json(body) if version == SHARDED_VERSION else None,
            reused=_reused(body.get("reused", {})),
            origin=_origin(body.get("origin", {})),
        )


def _origin(value: object) -> dict[str, Json]:
    return {str(k): v for k, v in as_object(value, "origin").items()}


def _check_aliases(path: str, manifest: Manifest) -> None:
    """Every alias a valid view of its stored base (:func:`alias_problem`), and all of them
    together (each distinct view once: tied weights repeat one view) at most
    ``MAX_ALIAS_AMPLIFICATION`` times the elements stored: readers (even ``inspect``, which
    reads the manifest alone) never pay much more than what is on disk."""
    logical = 0
    distinct: set[Alias] = set()  # tied weights are one view, however often they are named
    for name, alias in manifest.aliases.items():
        record = manifest.tensors.get(alias.base)
        if record is None:
            raise CorruptCheckpointError(path, f"alias {name!r} has no stored base")
        problem = alias_problem(alias, math.prod(record.shape))
        if problem is not None:
            raise CorruptCheckpointError(path, f"alias {name!r} of {alias.base!r} {problem}")
        if alias not in distinct:
            distinct.add(alias)
            logical += math.prod(alias.shape)
    stored = sum(math.prod(r.shape) for r in manifest.tensors.values())
    if logical > MAX_ALIAS_AMPLIFICATION * max(stored, 1):
        raise CorruptCheckpointError(
            path,
            f"its {len(distinct)} distinct aliases view {logical} elements, more than "
            f"{MAX_ALIAS_AMPLIFICATION} times the {stored} stored",
        )


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


class _Lines(list[str]):
    """A member's entries already encoded, one per line (see :func:`_tensor_lines`)."""


def _tensor_lines(tensors: dict[str, TensorRecord]) -> _Lines:
    """The ``tensors`` entries exactly as ``_compact`` writes them, without a ``json.dumps``
    per entry: 39 -> 11 ms for 3,304 tensors, part of every save (``bench/io.py``, durable
    save rows). Strings go through json's own ASCII escaper; shapes are plain ints."""
    enc = encode_basestring_ascii
    return _Lines(
        f' {enc(n)}:{{"file":{enc(r.file)},"dtype":{enc(r.dtype)},'
        f'"shape":[{",".join(map(str, r.shape))}]}}'
        for n, r in sorted(tensors.items())
    )


def _dump(body: dict[str, Any]) -> str:
    """The document: pieces gathered and joined once (no intermediate copy of a member)."""
    parts = ["{\n"]
    for i, (key, value) in enumerate(body.items()):
        if i:
            parts.append(",\n")
        if isinstance(value, _Lines):
            if value:
                parts += (_compact(key), ":{\n")
                for line in value:  # interleaved, not joined first: no copy of the member
                    parts += (line, ",\n")
                parts[-1] = "\n}"
            else:
                parts += (_compact(key), ":{}")
        elif key in ("files", "tensors", "aliases", "reused", "sharded") and value:
            inner = ",\n".join(f" {_compact(k)}:{_compact(v)}" for k, v in value.items())
            parts += (_compact(key), ":{\n", inner, "\n}")
        else:
            parts += (_compact(key), ":", _compact(value))
    parts.append("\n}\n")
    return "".join(parts)


def _reused(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise FormatError(f"reused must map file names to their sources, found {value!r}")
    return dict(value)


def _tensor_records(entries: object) -> dict[str, TensorRecord]:
    """The ``tensors`` member as records (read as such by :func:`parse_manifest_json`);
    ``FormatError`` naming the first entry that is not one."""
    if not isinstance(entries, TensorRecords):
        raise FormatError(f"tensors is a {type(entries).__name__}, not an object")
    for name in entries.malformed:
        if not isinstance(entries[name], TensorRecord):  # (a later duplicate may be one)
            raise FormatError(str(record_problem(name, entries[name])), key=name)
    return entries


def _ints(values: list[Any]) -> tuple[int, ...]:
    return tuple(_int(d) for d in values)


def _int(value: object) -> int:
    if type(value) is not int:
        raise FormatError(f"expected an integer, found {value!r}")
    return value


def _verify_self_checksum(path: str, text: str, body: dict[str, Any]) -> None:
    stored = body.get("manifest_checksum")
    at = text.rfind(_CHECKSUM_KEY)
    if not isinstance(stored, str) or not stored.startswith(f"{ALGORITHM}:") or at < 0:
        raise CorruptCheckpointError(path, "manifest has no manifest_checksum")
    cut = at + len(_CHECKSUM_KEY) + len(ALGORITHM) + 1
    zeroed = text[:cut] + _ZERO + text[cut + 32 :]
    if (
        text[cut : cut + 32] != stored.split(":", 1)[1]
        or checksum(zeroed.encode("ascii")) != stored
    ):
        raise CorruptCheckpointError(path, "manifest fails its checksum (the file was altered)")
