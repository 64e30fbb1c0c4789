"""The error tree's middle layer: each error is caught by its kind and by its builtin."""

from __future__ import annotations

import errno

import pytest

import statekeeper as sk
from statekeeper.errors import error_class, error_kinds


@pytest.mark.parametrize(
    ("error", "kind", "builtin"),
    [
        (sk.CorruptCheckpointError("p", "x"), sk.errors.CheckpointUnreadableError, ValueError),
        (
            sk.errors.UnsupportedFormatError("p", 9, [1]),
            sk.errors.CheckpointUnreadableError,
            ValueError,
        ),
        (
            sk.errors.UnsafePickleError("p", ["os.system"]),
            sk.errors.CheckpointUnreadableError,
            ValueError,
        ),
        (sk.KeyMismatchError(["a"]), sk.errors.StateMismatchError, KeyError),
        (sk.errors.LoadStateError("x"), sk.errors.StateMismatchError, RuntimeError),
        (sk.StepNotFoundError("x"), sk.errors.LocationError, FileNotFoundError),
        (sk.errors.StepExistsError("x", path="p"), sk.errors.LocationError, FileExistsError),
        (sk.errors.WriterConflictError("x"), sk.errors.LocationError, BlockingIOError),
        (sk.errors.StorageError(errno.ENOSPC, "full"), sk.errors.LocationError, OSError),
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
    assert sk.errors.StorageError(errno.ENOSPC, "full").errno == errno.ENOSPC


def test_rank_failure_names_and_types_its_causes() -> None:
    failure = sk.errors.RankFailure("rank 1 failed", ["CorruptCheckpointError", "KeyError"])
    assert failure.causes == (sk.CorruptCheckpointError, None)
    assert error_kinds(failure) == ("CorruptCheckpointError", "KeyError")
    assert error_kinds(sk.StepNotFoundError("gone")) == ("StepNotFoundError",)


def test_every_error_survives_a_trip_through_pickle() -> None:
    """torch.distributed gathers a rank's error with pickle: an error whose __init__ takes
    other arguments than its message must still come back whole (the other ranks would
    otherwise fail with a TypeError instead of reporting it)."""
    import pickle

    from statekeeper import errors

    made = [
        errors.CorruptCheckpointError("/run/step_000000001/tensors-00000.safetensors", "short"),
        errors.UnsupportedFormatError("/run", 9, [1, 2]),
        errors.KeyMismatchError(["model/w: missing"], "rebuild the model"),
        errors.StepExistsError("step 3 exists", "/run/step_000000003"),
    ]
    for error in made:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert back.__dict__ == error.__dict__
