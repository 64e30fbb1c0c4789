"""How much a step's manifest records about where it was written: the :class:`Origin` level,
from the save's ``origin=`` argument or the job's ``STATEKEEPER_ORIGIN`` variable."""

from __future__ import annotations

import os
from enum import StrEnum

from statekeeper.errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["ORIGIN_ENV", "Origin", "origin_level"]

ORIGIN_ENV = "STATEKEEPER_ORIGIN"


class Origin(StrEnum):
    """How much a step's manifest records about where it was written (its ``origin``).

    - ``FULL``: host name, the command line as run, world size, device kinds, git commit;
    - ``REDACTED`` (the default): the same, with the values of secret-looking arguments
      (``--token``, ``--api-key``, ``--password``, ``--secret``, ``*_KEY=``, ``*_TOKEN=``,
      a URL's ``user:password@``, token-shaped values) replaced by ``[redacted]``;
    - ``MINIMAL``: no command line and no host name (world size, device kinds, git commit);
    - ``NONE``: no ``origin`` member at all.

    The environment variable ``STATEKEEPER_ORIGIN`` (``full``, ``redacted``, ``minimal``,
    ``none``) sets it for every save of a job that passes no ``origin=``.
    """

    FULL = "full"
    REDACTED = "redacted"
    MINIMAL = "minimal"
    NONE = "none"


def origin_level(chosen: Origin | None = None) -> Origin:
    """``chosen``, else what ``STATEKEEPER_ORIGIN`` says, else ``Origin.REDACTED``; a value
    that is neither is an ``InvalidArgumentError`` naming the ones accepted (an
    ``InvalidArgumentTypeError`` for an argument that is no ``Origin``)."""
    if chosen is not None:
        if not isinstance(chosen, Origin):
            raise InvalidArgumentTypeError(
                f"origin must be a statekeeper.training.Origin (FULL, REDACTED, MINIMAL, NONE), "
                f"got {chosen!r}; pass e.g. origin=statekeeper.training.Origin.MINIMAL"
            )
        return chosen
    named = os.environ.get(ORIGIN_ENV, "").strip().lower()
    if not named:
        return Origin.REDACTED
    try:
        return Origin(named)
    except ValueError:
        raise InvalidArgumentError(
            f"{ORIGIN_ENV}={os.environ[ORIGIN_ENV]!r} is not a level of what a manifest records "
            f"about its origin; set it to one of {', '.join(o.value for o in Origin)}, or unset it"
        ) from None
