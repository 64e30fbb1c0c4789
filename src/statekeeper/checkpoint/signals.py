"""Pre-emption: remember that a signal came, save at the next step boundary.

A cluster that pre-empts a job sends a signal first (SLURM: ``--signal=USR1@120``; Kubernetes
and most schedulers: SIGTERM, then SIGKILL after a grace period). :class:`SignalWatch`
installs a handler that only records the signal (Python runs it between two bytecodes of
the main thread; it takes no lock, does no I/O and allocates nothing that matters), and the
``Checkpointer`` reads the record at the next ``maybe_save``: the save happens where the
training loop's state is consistent, never inside the handler.

A handler that was installed before is chained when it is a Python callable (it runs after
the record is taken); the default action and ``SIG_IGN`` are not (the default of SIGTERM
would end the process before the save). :meth:`SignalWatch.close` puts every previous handler
back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from statekeeper.errors import InvalidArgumentError

__all__ = ["SignalWatch", "signal_of"]

_CANNOT = {signal.SIGKILL, signal.SIGSTOP}
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def signal_of(value: object) -> signal.Signals:
    """``value`` (a ``signal.Signals``, a number or a name such as ``"SIGUSR1"``) as a signal
    that can be caught; ``InvalidArgumentError`` otherwise."""
    try:
        if isinstance(value, str):
            sig = signal.Signals[value if value.startswith("SIG") else f"SIG{value}"]
        elif isinstance(value, int) and not isinstance(value, bool):
            sig = signal.Signals(value)
        else:
            raise TypeError(value)
    except (KeyError, ValueError, TypeError):
        raise InvalidArgumentError(
            f"{value!r} is not a signal: pass signal.SIGTERM, signal.SIGUSR1, 'SIGUSR1' or a "
            "signal number"
        ) from None
    if sig in _CANNOT:
        raise InvalidArgumentError(f"{sig.name} cannot be caught: no save can run on it")
    return sig


class SignalWatch:
    """Records which of ``signals`` arrived since it was installed (in the main thread)."""

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self.signals = tuple(dict.fromkeys(signals))
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Handler] = {}
        if threading.current_thread() is not threading.main_thread():
            raise InvalidArgumentError(
                "OnSignal(...) installs signal handlers, which Python allows only in the main "
                "thread: create the Checkpointer in the main thread"
            )
        try:
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        except BaseException:
            self.close()
            raise

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
        previous = self._previous.get(signal.Signals(signum))
        if callable(previous):
            previous(signum, frame)

    @property
    def fired(self) -> bool:
        return self.received is not None

    def close(self) -> None:
        """Put back the handlers that were installed before (main thread only)."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
