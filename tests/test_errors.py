"""The error tree's middle layer: each error is caught by its kind and by its builtin."""

from __future__ import annotations

import errno

import pytest

import statekeeper as sk
from statekeeper.errors import error_class, error_kinds


@pytest.mark.parametrize(
    ("error", "kind", "builtin"),
    [
        (sk.CorruptCheckpointError("p", "x"), sk.CheckpointUnreadableError, ValueError),
        (sk.UnsupportedFormatError("p", 9, [1]), sk.CheckpointUnreadableError, ValueError),
        (sk.UnsafePickleError("p", ["os.system"]), sk.CheckpointUnreadableError, ValueError),
        (sk.KeyMismatchError(["a"]), sk.StateMismatchError, KeyError),
        (sk.LoadStateError("x"), sk.StateMismatchError, RuntimeError),
        (sk.StepNotFoundError("x"), sk.LocationError, FileNotFoundError),
        (sk.StepExistsError("x", path="p"), sk.LocationError, FileExistsError),
        (sk.WriterConflictError("x"), sk.LocationError, BlockingIOError),
        (sk.StorageError(errno.ENOSPC, "full"), sk.LocationError, OSError),
    ],
)
def test_every_error_has_a_kind_and_a_builtin(
    error: Exception, kind: type[Exception], builtin: type[Exception]
) -> None:
    assert isinstance(error, kind) and isinstance(error, builtin)
    assert isinstance(error, sk.StatekeeperError)
    assert error_class(type(error).__name__) is type(error)


def test_error_class_knows_only_statekeeper_errors() -> None:
    assert error_class("ValueError") is None and error_class("nope") is None
    assert sk.StorageError(errno.ENOSPC, "full").errno == errno.ENOSPC


def test_rank_failure_names_and_types_its_causes() -> None:
    failure = sk.RankFailure("rank 1 failed", ["CorruptCheckpointError", "KeyError"])
    assert failure.causes == (sk.CorruptCheckpointError, None)
    assert error_kinds(failure) == ("CorruptCheckpointError", "KeyError")
    assert error_kinds(sk.StepNotFoundError("gone")) == ("StepNotFoundError",)
