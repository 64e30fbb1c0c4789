"""A second tier: every committed step copied, in the background, to a mirror.

A Checkpointer with ``mirror=Mirror("s3://bucket/run", ...)`` commits each step on its own
(local, fast) tier as always, then hands the step to an uploader
(:mod:`statekeeper.loop.mirror.uploader`). Its
thread copies the step to the mirror with the mirror's own commit protocol: every tensor
file first, each checked against the checksum the manifest records for it while it is
streamed (a local file damaged since the save is never uploaded as good), the manifest last,
byte for byte. A file that the mirror's previous step holds with the same checksum is copied
by the store itself (incremental). At most ``concurrency`` files move at once; a failed
request is retried ``retries`` times, waiting ``backoff`` seconds, doubled each time, and
gives up after ``timeout`` seconds without an answer. Steps waiting for their upload are
recorded in the run directory's upload journal, so that a killed process's are uploaded by
the next one; a resume reads both tiers (:mod:`statekeeper.loop.mirror.tiered`).

An upload that fails for good leaves no committed step on the mirror; it is kept, warned
about at the next save, raised (:class:`~statekeeper.errors.MirrorError`) by ``wait()`` and
``close()``, tried again with the next saves (``RETRY_STEPS`` tries in all), and never
blocks training: the next steps upload as usual. A step waiting for its upload, or failed
with tries left, is never deleted by the local tier's retention. After each upload the
mirror's own retention policy (``Mirror.keep``) applies to the mirror.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from statekeeper.arguments import require_count, require_instance, require_path, require_seconds
from statekeeper.catalog.location import PathOrStorage
from statekeeper.checkpoint.retention_policies import Retention
from statekeeper.errors import InvalidArgumentError
from statekeeper.storage.base import Storage

__all__ = ["Mirror", "MirrorStatus", "require_single_process"]


@dataclass(frozen=True)
class Mirror:
    """Where committed steps are copied (a URL such as ``"s3://bucket/run"``, a path, or a
    Storage), which of them the mirror keeps (``keep``; None keeps all), how many files move
    at once (``concurrency``), how often a failed request is retried (``retries``, waiting
    ``backoff`` seconds before the first retry, doubling), how long one request may go
    without an answer (``timeout`` seconds: to connect, and between two reads; on a resume
    with local steps, the whole listing of the mirror), and how long ``close()`` waits for
    the uploads (``close_timeout`` seconds; None waits for ever).

    Args:
        directory: The second tier (a run directory): a URL, a path or a :class:`Storage`.
        keep: :class:`Retention` of the mirror; ``None`` keeps all.
        concurrency: Files uploaded at once.
        retries: Retries of a failed request.
        backoff: Seconds before the first retry, doubling.
        timeout: Seconds one request may go without an answer.
        close_timeout: Seconds ``close()`` waits for the uploads; ``None`` waits for ever.

    Raises:
        InvalidArgumentError: An option of the wrong kind or value.
    """

    directory: PathOrStorage
    keep: Retention | None = None
    concurrency: int = 4
    retries: int = 3
    backoff: float = 0.5
    timeout: float = 10.0
    close_timeout: float | None = 300.0

    def __post_init__(self) -> None:
        """Every field is checked here, naming it: a wrong type is
        ``InvalidArgumentTypeError``, a value out of range ``InvalidArgumentError``."""
        require_path("Mirror directory", self.directory, (Storage,))
        if self.keep is not None:
            require_instance(
                "Mirror keep", self.keep, Retention, "a retention policy such as KeepEvery(10)"
            )
        require_count("Mirror concurrency", self.concurrency, minimum=1)
        require_count("Mirror retries", self.retries)
        require_seconds("Mirror backoff", self.backoff, zero=True)
        require_seconds("Mirror timeout", self.timeout)
        require_seconds("Mirror close_timeout", self.close_timeout, optional=True)


@dataclass(frozen=True)
class MirrorStatus:
    """Where the uploads stand: steps waiting, the one being uploaded, the newest uploaded,
    and the steps whose upload failed (with why).

    Attributes:
        where: The mirror's location.
        waiting: The committed steps queued for upload, oldest first.
        uploading: The step being uploaded, or ``None``.
        uploaded: The newest step uploaded, or ``None``.
        failed: The steps whose upload failed, each with why.
    """

    where: str
    waiting: tuple[int, ...]
    uploading: int | None
    uploaded: int | None
    failed: dict[int, str] = field(default_factory=dict)


def require_single_process(distributed: bool, step: int | None = None) -> None:
    """``InvalidArgumentError`` for a mirror in a multi-process job (not supported yet):
    at construction, or when ``step`` was saved after ``init_process_group()``."""
    if not distributed:
        return
    if step is None:
        raise InvalidArgumentError(
            "mirror= is for single-process runs for now: in a multi-process job each "
            "rank's files may be on its own node; save to the shared or remote storage"
        )
    raise InvalidArgumentError(
        f"step {step} is saved, but mirror= is for single-process runs: "
        "create the Checkpointer after init_process_group(), without mirror="
    )
