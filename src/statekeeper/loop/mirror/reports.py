"""What the uploader tells the user: each warning and error names the steps, the mirror and
what happens to them next (see :mod:`statekeeper.loop.mirror.uploader`)."""

from __future__ import annotations

import warnings

from statekeeper.errors import MirrorError, StatekeeperWarning, user_stacklevel

__all__ = [
    "RETRY_STEPS",
    "failed_uploads",
    "warn_failure",
    "warn_gone",
    "warn_left",
    "warn_retention",
]

RETRY_STEPS = 3
"""How many times in all a step's upload is tried in one process (once, then with each of
the next saves)."""


def _warn(message: str) -> None:
    warnings.warn(f"statekeeper: {message}", StatekeeperWarning, stacklevel=user_stacklevel())


def warn_gone(gone: list[int], local: str, remote: str) -> None:
    """Steps the journal lists that the local tier no longer holds."""
    _warn(
        f"steps {gone} of {local} were waiting for their upload to {remote} but are no longer "
        "on the local tier: they cannot be uploaded (check that the mirror holds what it should)"
    )


def warn_failure(step: int, remote: str, exc: BaseException) -> None:
    _warn(
        f"uploading step {step} to {remote} failed ({type(exc).__name__}: {exc}); the step "
        "stays on the local tier and its upload is tried again with the next save; "
        "wait()/close() raise it"
    )


def failed_uploads(remote: str, errors: list[tuple[int, BaseException]]) -> MirrorError:
    """The ``MirrorError`` that ``wait()`` and ``close()`` raise for failed uploads."""
    detail = "; ".join(f"step {s}: {type(e).__name__}: {e}" for s, e in errors)
    return MirrorError(
        f"uploading to {remote} failed ({detail}). Later steps were uploaded as usual; a "
        "failed step stays on the local tier while its upload is tried again (with each of "
        f"the next {RETRY_STEPS} saves, and by the next process, from the upload journal)",
        [s for s, _ in errors],
    )


def warn_left(
    why: str, remote: str, journal: str, left: list[int], timeout: float | None, settled: bool
) -> None:
    """``close()`` (``why``) returns with steps ``left`` not uploaded: past ``timeout``
    (None: stopped after a failure); ``settled`` False: a change of the run was in flight."""
    reason = (
        "stopped after an upload failed"
        if timeout is None
        else f"did not finish within Mirror(close_timeout={timeout:g}) s"
    )
    _warn(
        f"{why}: the uploads to {remote} {reason}; steps {left} are not on the mirror. They "
        f"stay on the local tier and in its upload journal ({journal}): the next Checkpointer "
        "with this mirror uploads them (Mirror(close_timeout=None) makes close() wait for them)"
        + (
            ""
            if settled
            else "; a write of that journal or a removal by the mirror's retention was still "
            "in flight (check the journal and the mirror)"
        )
    )


def warn_retention(remote: str, step: int, exc: BaseException) -> None:
    _warn(
        f"retention on the mirror {remote} failed after step {step} ({exc}); it runs again "
        "after the next upload"
    )
