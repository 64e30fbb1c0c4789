"""The upload journal: which committed steps of the local tier still wait for their upload.

A small JSON file in the run directory (:data:`JOURNAL`), replaced atomically (a
temporary file renamed over it on a local disk; one PUT on an object store) whenever the
set of waiting steps changes. A process killed in the middle of an upload leaves its steps
there; the next Checkpointer with the same mirror uploads them, and its local retention
keeps them until then. One journal serves every mirror of a run, each under its own name::

    {"format": "statekeeper-uploads", "version": 1, "mirrors": {"s3://bucket/run": [5, 6]}}

A local tier that is neither a local directory nor an fsspec store keeps no journal (the
uploads are then tracked in memory only).
"""

from __future__ import annotations

import json
import warnings

from statekeeper.errors import StatekeeperError, StatekeeperWarning
from statekeeper.format.jsondoc import parse_json
from statekeeper.format.malformed import FormatError, as_object, member
from statekeeper.storage.base import Storage
from statekeeper.storage.fsspec import FsspecStorage
from statekeeper.storage.local import LocalStorage, write_file

__all__ = ["JOURNAL", "Journal"]

JOURNAL = ".statekeeper-uploads.json"
"""The journal's file name, in the run directory."""

_FORMAT = "statekeeper-uploads"
_MAX_BYTES = 1 << 20  # a journal lists steps: anything larger is not one


class Journal:
    """The waiting steps of ``local`` for the mirror named ``mirror`` (its description)."""

    def __init__(self, local: Storage, mirror: str) -> None:
        self.local = local
        self.mirror = mirror
        self._written: tuple[int, ...] | None = None
        self.enabled = isinstance(local, LocalStorage | FsspecStorage)

    def where(self) -> str:
        return self.local.describe("", JOURNAL)

    def _load_all(self) -> dict[str, list[int]]:
        data = self._read_bytes()
        if data is None:
            return {}
        try:
            if len(data) > _MAX_BYTES:
                raise FormatError(f"{len(data)} bytes")
            parsed = as_object(parse_json(data), "the journal")
            mirrors = member(parsed, "mirrors", "the journal")
            if parsed.get("format") != _FORMAT or not isinstance(mirrors, dict):
                raise FormatError("not a statekeeper upload journal")
            out: dict[str, list[int]] = {}
            for name, steps in mirrors.items():
                if not isinstance(steps, list) or not all(type(s) is int and s >= 0 for s in steps):
                    raise FormatError(f"bad steps for {name!r}")
                out[str(name)] = sorted(set(steps))
            return out
        except FormatError as exc:
            warnings.warn(
                f"statekeeper: the upload journal {self.where()} is damaged ({exc}); steps "
                "that were waiting for their upload are not known: check that the mirror "
                "holds the steps it should (list_checkpoints of the mirror lists them). The "
                "journal is written anew with the next save",
                StatekeeperWarning,
                stacklevel=3,
            )
            return {}

    def _read_bytes(self) -> bytes | None:
        try:
            if isinstance(self.local, LocalStorage):
                path = self.local.root / JOURNAL
                if not path.is_file() or path.is_symlink():
                    return None
                with open(path, "rb") as f:
                    return f.read(_MAX_BYTES + 1)
            if isinstance(self.local, FsspecStorage):
                return bytes(self.local.fs.cat_file(self.local.path("", JOURNAL)))
        except FileNotFoundError:
            return None
        except OSError as exc:
            warnings.warn(
                f"statekeeper: cannot read the upload journal {self.where()} ({exc}); steps "
                "waiting for their upload since an earlier process are not resumed",
                StatekeeperWarning,
                stacklevel=3,
            )
        return None

    def read(self) -> set[int]:
        """The steps waiting for this mirror (empty without a journal)."""
        return set(self._load_all().get(self.mirror, [])) if self.enabled else set()

    def write(self, steps: set[int]) -> None:
        """Record ``steps`` as this mirror's waiting steps (nothing when unchanged). A failure
        is warned about: the uploads go on, tracked in memory."""
        wanted = tuple(sorted(steps))
        if not self.enabled or wanted == self._written:
            return
        try:
            mirrors = self._load_all()
            if wanted:
                mirrors[self.mirror] = list(wanted)
            else:
                mirrors.pop(self.mirror, None)
            data = json.dumps(
                {"format": _FORMAT, "mirrors": mirrors, "version": 1}, sort_keys=True
            ).encode()
            if isinstance(self.local, LocalStorage):
                write_file(self.local.root / JOURNAL, [data])
            elif isinstance(self.local, FsspecStorage):
                self.local.fs.pipe_file(self.local.path("", JOURNAL), data)
        except (OSError, StatekeeperError) as exc:
            warnings.warn(
                f"statekeeper: cannot write the upload journal {self.where()} ({exc}); the "
                f"steps waiting for their upload ({list(wanted)}) are tracked in memory only: "
                "a process killed now does not resume them. Free space on the local tier",
                StatekeeperWarning,
                stacklevel=3,
            )
            return
        self._written = wanted
