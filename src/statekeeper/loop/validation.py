"""What a :class:`~statekeeper.loop.checkpointer.Checkpointer`'s constructor takes, checked
before anything is opened: each option of the wrong type is named with what it takes."""

from __future__ import annotations

from statekeeper.arguments import require_bool, require_instance
from statekeeper.checkpoint.retention_policies import Retention
from statekeeper.loop.mirror.config import Mirror
from statekeeper.loop.save_policies import SavePolicy

__all__ = ["check_checkpointer_options"]

_CHECKPOINTER_OPTIONS = (  # Checkpointer(name=...): what it takes, named as the fix
    ("keep", Retention, "a retention policy such as KeepLatest(3)"),
    ("every", SavePolicy, "a save policy such as EverySteps(100)"),
    ("mirror", Mirror, "a statekeeper.Mirror('s3://bucket/run', ...)"),
)


def check_checkpointer_options(
    keep: object, every: object, mirror: object, blocking: object
) -> None:
    """``InvalidArgumentTypeError`` naming the ``Checkpointer`` argument of the wrong type
    and what it takes."""
    for (name, kind, what), value in zip(_CHECKPOINTER_OPTIONS, (keep, every, mirror), strict=True):
        if value is not None:
            require_instance(name, value, kind, what)
    require_bool("blocking", blocking)
