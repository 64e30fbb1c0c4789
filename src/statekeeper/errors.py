"""Every error statekeeper raises.

The tree, with a middle layer that says what kind of failure it is (a builtin in
parentheses is a further base class; ``tests/test_errors.py`` checks this drawing against
the classes)::

    StatekeeperError
    ├── CheckpointUnreadableError (ValueError)   the checkpoint on disk cannot be used as it is
    │   ├── CorruptCheckpointError               a file missing, truncated, odd, or unverified
    │   ├── UnsupportedFormatError               the manifest's format or version is not one we read
    │   └── UnsafePickleError                    a pickle-based file needs more than weights_only
    ├── StateMismatchError                       the checkpoint and the live objects disagree
    │   ├── KeyMismatchError (KeyError)          keys, shapes, dtypes, optimizer class
    │   └── LoadStateError (RuntimeError)        an object's load_state_dict() rejected its state
    ├── LocationError (OSError)                  where the checkpoint should be
    │   ├── StepNotFoundError (FileNotFoundError)  no such committed step, path, or it was deleted
    │   ├── OutputExistsError (FileExistsError)  an output file or step is already there
    │   │   └── StepExistsError                  the step is already committed
    │   ├── WriterConflictError (BlockingIOError)  another live writer holds the run directory
    │   └── StorageError                         the storage failed an operation (errno kept)
    │       ├── MirrorError                      a step could not be copied to the mirror tier
    │       └── InjectedFailure                  MemoryStorage(fail_at=k)'s planned failure
    ├── InvalidArgumentError (ValueError)        an argument is out of range or of the wrong kind
    │   └── InvalidArgumentTypeError (TypeError)  an argument of the wrong type
    ├── UnsupportedValueError (TypeError)        a value that cannot be stored without pickle
    └── RankFailure (RuntimeError)               another rank of a distributed save/load failed

    StatekeeperWarning (UserWarning)             something repaired or worth knowing
    └── SharedRankStateWarning                   one process's Lightning state on every rank

Code branches on these classes; across ranks, where only class names travel,
:func:`error_class` turns a name back into its class.

``StatekeeperWarning`` (a ``UserWarning``) is the root of the warnings: something was
repaired or is worth knowing, but nothing was lost.

Each subclass also derives from the builtin that fits, so ``except FileNotFoundError`` keeps
working in code that does not know statekeeper. Messages name the key, file or step and the fix.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CheckpointUnreadableError",
    "CorruptCheckpointError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "KeyMismatchError",
    "LoadStateError",
    "LocationError",
    "MirrorError",
    "OutputExistsError",
    "RankFailure",
    "StatekeeperError",
    "StatekeeperWarning",
    "StateMismatchError",
    "StepExistsError",
    "StepNotFoundError",
    "StorageError",
    "UnsafePickleError",
    "UnsupportedFormatError",
    "UnsupportedValueError",
    "WriterConflictError",
]


_IN_STEP = re.compile(r"(^|[/\\])step_\d+([/\\.]|$)")
"""A path inside (or of) a statekeeper step directory, whose run may hold older steps."""


class StatekeeperError(Exception):
    """Root of every error statekeeper raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        # errors cross processes (torch.distributed gathers a rank's error with pickle):
        # rebuilt from their arguments and attributes, whatever their own __init__ takes
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], attrs: dict[str, Any]) -> Any:
    error = cls.__new__(cls)
    BaseException.__init__(error, *args)
    error.__dict__.update(attrs)
    return error


class StatekeeperWarning(UserWarning):
    """Something was repaired or is worth knowing, but nothing was lost."""


class CheckpointUnreadableError(StatekeeperError, ValueError):
    """The checkpoint on disk cannot be used as it is (damaged, unsupported, unsafe)."""


class StateMismatchError(StatekeeperError):
    """The checkpoint and the live objects disagree; nothing was loaded (``KeyMismatchError``)
    or an object's own ``load_state_dict`` refused its state (``LoadStateError``)."""


class LocationError(StatekeeperError, OSError):
    """Where the checkpoint should be: a missing or existing step, a writer conflict, storage."""


class CorruptCheckpointError(CheckpointUnreadableError):
    """A checkpoint file is missing, truncated, malformed or fails its checksum."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        if _IN_STEP.search(path):
            fix = "load an older step (statekeeper ls shows them) or restore the file from a copy"
        else:  # a foreign checkpoint: it has no older steps
            fix = "restore the file from a copy, or save it again from its source"
        super().__init__(f"{path}: {problem}. The checkpoint is damaged; {fix}.")


class UnsupportedFormatError(CheckpointUnreadableError):
    """The manifest declares a format or version this release cannot read."""

    def __init__(self, path: str, found: object, supported: Sequence[object]) -> None:
        self.path = path
        self.found = found
        self.supported = tuple(supported)
        super().__init__(
            f"{path}: format version {found!r} is not supported (this release reads "
            f"{', '.join(map(repr, self.supported))}); upgrade statekeeper to read it."
        )


class UnsafePickleError(CheckpointUnreadableError):
    """A pickle-based file (``torch.save``, Lightning, Accelerate) asks for more than tensors.

    It was refused, never loaded: ``torch.load`` with ``weights_only=True`` would have had to
    import ``globals`` (``module.name`` strings found by reading the pickle's opcodes, nothing
    run).
    """

    def __init__(self, path: str, globals_: Sequence[str], reason: str = "") -> None:
        self.path = path
        self.globals = tuple(globals_)
        what = (
            f"it asks for {len(self.globals)} global(s) that weights_only loading does not "
            f"allow: {', '.join(self.globals)}"
            if self.globals
            else f"weights_only loading cannot read it ({reason or 'unsupported pickle'})"
        )
        super().__init__(
            f"{path}: refused to load this pickle file: {what}. Nothing from it was executed. "
            "Fix: re-save it holding only tensors and plain values (e.g. torch.save(model."
            "state_dict(), path)), or convert it with `statekeeper convert` in an environment "
            "where you trust the file and its code."
        )


class KeyMismatchError(StateMismatchError, KeyError):
    """Live state and checkpoint disagree; ``problems`` lists every mismatch."""

    def __init__(self, problems: Sequence[str], hint: str = "") -> None:
        self.problems = tuple(problems)
        lines = "\n  ".join(self.problems)
        fix = hint or (
            "Build the live objects the way the checkpoint was saved, or pass "
            "strict=Strict.ALLOW_MISSING / ALLOW_UNEXPECTED / PARTIAL to opt out of key checks."
        )
        count = len(self.problems)
        self.message = f"{count} mismatch(es):\n  {lines}\n{fix}"
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class UnsupportedValueError(StatekeeperError, TypeError):
    """A value in the state cannot be stored without pickle."""

    def __init__(self, key_path: str, value: object, what: str = "", *, reason: str = "") -> None:
        self.key_path = key_path
        self.value_type = type(value)
        where = f"state at {key_path or '<root>'}"
        if reason:
            message = f"{reason}. Flatten that part of the state."
        elif what:
            message = (
                f"{where} holds {what}, which safetensors has no code for. Convert it in the "
                "object's state_dict() (to a supported dtype, or .view() it as uint8 and store "
                "the dtype's name beside it)."
            )
        else:
            message = (
                f"{where} holds a {type(value).__module__}.{type(value).__qualname__}, which "
                "statekeeper cannot store without pickle. Convert it to tensors, numbers, "
                "strings, bytes, lists, tuples or dicts in the object's state_dict()."
            )
        super().__init__(message)


class StepNotFoundError(LocationError, FileNotFoundError):
    """The requested committed step does not exist."""


class OutputExistsError(LocationError, FileExistsError):
    """An output (a file that ``convert``, ``export`` or ``average_checkpoints`` would write,
    or a committed step) already exists; ``path`` names it. ``overwrite=True`` replaces it."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class StepExistsError(OutputExistsError):
    """A committed step with that number already exists; ``path`` names it."""


class WriterConflictError(LocationError, BlockingIOError):
    """Another live writer holds the run directory."""


class StorageError(LocationError):
    """The storage backend failed an operation."""

    def __str__(self) -> str:
        if self.errno is None and self.strerror is not None:
            return str(self.strerror)  # no "[Errno None]" before the message
        return super().__str__()


class MirrorError(StorageError):
    """A committed step could not be copied to the mirror tier (after retries); it is intact
    on the local tier. ``steps`` lists the steps whose upload failed."""

    def __init__(self, message: str, steps: Sequence[int] = ()) -> None:
        super().__init__(None, message)
        self.steps = tuple(steps)


class InvalidArgumentError(StatekeeperError, ValueError):
    """An argument is out of range or of the wrong kind."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (a list where a mapping goes, a str where a bool does):
    caught as ``InvalidArgumentError`` and as ``TypeError``."""


class LoadStateError(StateMismatchError, RuntimeError):
    """An object's own ``load_state_dict`` rejected the state statekeeper handed it."""


class RankFailure(StatekeeperError, RuntimeError):
    """Another rank failed during a collective save or load; the message names it and why.

    ``kinds`` holds the class names of the errors the failing ranks raised."""

    def __init__(self, message: str, kinds: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.kinds = tuple(kinds)

    @property
    def causes(self) -> tuple[type[StatekeeperError] | None, ...]:
        """The classes of the failing ranks' errors, in ``kinds``' order (None for an error
        that is not a statekeeper one): code branches on these, not on the names."""
        return tuple(error_class(kind) for kind in self.kinds)


def error_class(name: str) -> type[StatekeeperError] | None:
    """The statekeeper error class called ``name`` (errors cross ranks as names), or None."""
    found = globals().get(name)
    if isinstance(found, type) and issubclass(found, StatekeeperError):
        return found
    return None


def error_kinds(exc: BaseException) -> tuple[str, ...]:
    """The class names of the errors raised for one step: in a distributed job every failing
    rank's (the same tuple on every rank, so that all ranks decide alike), else ``exc``'s."""
    if isinstance(exc, RankFailure):
        return exc.kinds
    return tuple(getattr(exc, "rank_kinds", (type(exc).__name__,)))


def raised_only(exc: BaseException, *kinds: type[StatekeeperError]) -> bool:
    """Whether every error raised for the step (in a job: every failing rank's, the same
    answer on every rank) is one of ``kinds``."""
    classes = [error_class(kind) for kind in error_kinds(exc)]
    return bool(classes) and all(c is not None and issubclass(c, kinds) for c in classes)


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the first caller outside statekeeper
    (the user's line), however deep inside the library the warning is raised. Call it from
    the function that calls ``warnings.warn``."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _PACKAGE
    ):
        frame = frame.f_back
        level += 1
    return level
