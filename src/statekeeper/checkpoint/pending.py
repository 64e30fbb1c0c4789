"""A background save as an object its caller owns: :class:`PendingSave`.

``save(..., blocking=False)`` returns one; nothing else in the process remembers it. Its
owner waits for it (``wait()``, or a ``with`` block), asks ``done()``, or reads ``error``
once it is done. What is never lost:

- a ``PendingSave`` of a one-off save dropped while its save still runs gives a
  :class:`~statekeeper.errors.StatekeeperWarning` naming the step at once; the save goes on
  (the interpreter's exit waits for it) and, should it then fail, its failure is given as a
  second warning from the writing thread;
- one dropped after its save failed, its error never retrieved, gives a warning naming the
  step and the error.

A ``Checkpointer``'s background saves belong to the Checkpointer (its ``wait()``,
``close()`` and next save report them): dropping the ``PendingSave`` it returns says nothing.
"""

from __future__ import annotations

import threading
import warnings
from types import TracebackType
from typing import Protocol

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.errors import StatekeeperWarning

__all__ = ["Outcome", "PendingSave"]


class Outcome:
    """What the writing thread hands back: set once, under a lock, with the result or the
    error (the thread holds this, never the ``PendingSave``, so that dropping the latter is
    seen at once)."""

    def __init__(self, step: int, where: str) -> None:
        self.step = step
        self.where = where
        self.event = threading.Event()
        self.info: CheckpointInfo | None = None
        self.error: BaseException | None = None
        self.reported = False  # its owner saw the result or the error
        self._lock = threading.Lock()
        self._abandoned = False

    def finish(self) -> None:
        """Mark it done (the writing thread); warn if its owner dropped it and it failed."""
        with self._lock:
            self.event.set()
            abandoned = self._abandoned
        if abandoned and self.error is not None:
            _warn_failed(self, 1)

    def abandon(self, stacklevel: int) -> None:
        """Its owner dropped it without looking: loud, now or when it fails."""
        with self._lock:
            running = not self.event.is_set()
            self._abandoned = running
        if running:
            warnings.warn(
                f"the background save of step {self.step} into {self.where} was dropped "
                "before it was waited for: it goes on (the interpreter's exit waits for it) "
                "and a failure is only given as a warning. Keep what save(blocking=False) "
                "returns and call its wait(), or use it as a context manager",
                StatekeeperWarning,
                stacklevel=stacklevel + 1,
            )
        elif self.error is not None and not self.reported:
            _warn_failed(self, stacklevel + 1)


def _warn_failed(outcome: Outcome, stacklevel: int) -> None:
    warnings.warn(
        f"the background save of step {outcome.step} into {outcome.where} failed and nobody "
        f"waited for it: {type(outcome.error).__name__}: {outcome.error}. Step "
        f"{outcome.step} is not committed: call wait() on what save(blocking=False) returns "
        "to see such failures as exceptions",
        StatekeeperWarning,
        stacklevel=stacklevel + 1,
    )


class _Writer(Protocol):
    def _consume(self, outcome: Outcome) -> None: ...


class PendingSave:
    """A save running in the background: ``wait()`` returns its ``CheckpointInfo`` or
    raises its error; ``with save(..., blocking=False) as pending:`` waits at the end of
    the block. Owned by whoever holds it (see the module docstring for one dropped unwaited).
    """

    def __init__(self, writer: _Writer, outcome: Outcome, *, owned: bool) -> None:
        self._writer = writer
        self._outcome = outcome
        self._owned = owned  # a one-off save's: its caller alone reports it
        self.step = outcome.step

    def done(self) -> bool:
        """Whether the save has ended (committed or failed); never blocks.

        Returns:
            True once the save has committed or failed, False while it still runs.
        """
        return self._outcome.event.is_set()

    @property
    def error(self) -> BaseException | None:
        """The save's error once it has ended (None while it runs, or if it committed)."""
        if not self.done():
            return None
        self._outcome.reported = True
        return self._outcome.error

    def wait(self) -> CheckpointInfo:
        """Block until the step is committed and return its ``CheckpointInfo``; raise the
        save's error if it failed.

        Returns:
            The committed step's :class:`CheckpointInfo`.

        Raises:
            BaseException: The save's own error (the one :attr:`error` gives), when it failed.
        """
        outcome = self._outcome
        outcome.event.wait()
        outcome.reported = True
        self._writer._consume(outcome)
        if outcome.error is not None:
            raise outcome.error
        if outcome.info is None:  # pragma: no cover - done is set only after one of the two
            raise RuntimeError("background save finished without a result")
        return outcome.info

    @property
    def result(self) -> CheckpointInfo:
        """``wait()``'s result."""
        return self.wait()

    def __enter__(self) -> PendingSave:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.wait()
            return
        self._outcome.event.wait()  # the block's own error goes on; the save's is a warning
        if self._outcome.error is not None and not self._outcome.reported:
            self._outcome.reported = True
            _warn_failed(self._outcome, 2)

    def __del__(self) -> None:
        outcome = getattr(self, "_outcome", None)
        if outcome is not None and self._owned and not outcome.reported:
            outcome.abandon(2)

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"PendingSave(step={self.step}, {state})"
