"""Pre-emption: remember that a signal came, save at the next step boundary.

A cluster that pre-empts a job sends a signal first (SLURM: ``--signal``; Kubernetes and
most schedulers: SIGTERM, then SIGKILL after a grace period). :class:`SignalWatch`
installs a handler that only records the signal; the ``Checkpointer`` reads the record at
the next ``maybe_save`` and saves there, where the training loop's state is consistent.

What was installed before is honoured, later:

- a Python handler installed before (``signal.default_int_handler`` for SIGINT, a
  framework's, the user's) runs *after* the save, when the Checkpointer calls
  :meth:`SignalWatch.chain` (so a handler that exits or raises ends the loop once the step
  is safe);
- the default action and ``SIG_IGN`` are applied by :meth:`close` to a signal that came but
  was not served by a save (the default of SIGTERM then ends the process, as it would have);
- :meth:`close` puts the earlier handler back only where the watch's handler is still the
  installed one; a watch that is closed, or that nobody references any more (a Checkpointer
  dropped without ``close``), passes signals on to what was there before.

After a pre-emption save (:meth:`SignalWatch.chain`) the process is on its way out with
``Checkpointer.PREEMPTED_EXIT_CODE``; launchers often send SIGTERM again meanwhile (and
``close()`` may wait for uploads). A watched signal whose earlier disposition was the
default action then never ends the process with that action (which would turn the exit
status into 143 and stop a scheduler from requeueing a job that saved): :meth:`close` does
not pass such a signal on, and installs :func:`ignore_after_preemption` for it instead of
``SIG_DFL``. Earlier Python handlers are still run and put back as above.
"""

from __future__ import annotations

import signal
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, TypeVar

from statekeeper.errors import InvalidArgumentError, StatekeeperWarning, user_stacklevel

__all__ = ["SignalWatch", "ignore_after_preemption", "preempt", "signal_of"]

T = TypeVar("T")

_CANNOT = {signal.SIGKILL, signal.SIGSTOP}
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def signal_of(value: object) -> signal.Signals:
    """``value`` (a ``signal.Signals``, a number or a name such as ``"SIGUSR1"``) as a signal
    that can be caught; ``InvalidArgumentError`` otherwise."""
    try:
        if isinstance(value, str):
            name = value.upper()
            sig = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
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


def _pass_on(sig: signal.Signals, previous: Handler, frame: FrameType | None) -> None:
    """Do what ``previous`` (the disposition before the watch) would have done."""
    if callable(previous):
        previous(int(sig), frame)
    elif previous != signal.SIG_IGN:  # the default action (SIG_DFL, or unknown: C-level)
        signal.signal(sig, signal.SIG_DFL)
        signal.raise_signal(sig)


def ignore_after_preemption(signum: int, frame: FrameType | None) -> None:
    """The handler a watched signal keeps after a pre-emption save where its earlier
    disposition was the default action: the signal is ignored, so the process ends with the
    exit code the loop chose (``PREEMPTED_EXIT_CODE``), not with the signal's. A Python
    handler rather than ``SIG_IGN``: programs this process starts later get the default
    disposition back (``SIG_IGN`` would be inherited across ``exec``)."""


def _handler(watch: weakref.ref[SignalWatch], sig: signal.Signals, previous: Handler) -> Any:
    def handle(signum: int, frame: FrameType | None) -> None:
        owner = watch()
        if owner is not None and owner.served and not callable(previous):
            if not owner.closed and owner.received is None:
                owner.received = sig  # a loop that goes on saves again at its next boundary
            return  # never the default action: the process ends with the loop's exit code
        if owner is None or owner.closed:
            _pass_on(sig, previous, frame)
        elif owner.received is None:
            owner.received = sig

    return handle


class SignalWatch:
    """Records which of ``signals`` arrived first since it was installed (main thread)."""

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self.signals = tuple(dict.fromkeys(signals))
        self.received: signal.Signals | None = None
        self.closed = False
        self.served = False  # a pre-emption save was made: the process is ending
        self._installed: dict[signal.Signals, tuple[Any, Handler]] = {}
        if threading.current_thread() is not threading.main_thread():
            raise InvalidArgumentError(
                "OnSignal(...) installs signal handlers, which Python allows only in the main "
                "thread: create the Checkpointer in the main thread"
            )
        try:
            for sig in self.signals:
                previous = signal.getsignal(sig)
                handle = _handler(weakref.ref(self), sig, previous)
                signal.signal(sig, handle)
                self._installed[sig] = (handle, previous)
        except BaseException:
            self.close()
            raise

    @property
    def fired(self) -> bool:
        return self.received is not None

    def installed(self) -> bool:
        """Whether every watched signal still reaches this watch (nobody replaced it)."""
        return all(signal.getsignal(s) is h for s, (h, _) in self._installed.items())

    def warn_if_replaced(self) -> None:
        """A ``StatekeeperWarning`` when another handler replaced one of the watch's."""
        if not self.installed():
            warnings.warn(
                "statekeeper: another signal handler replaced the Checkpointer's for "
                f"{', '.join(s.name for s in self.signals)}: OnSignal no longer sees them",
                StatekeeperWarning,
                stacklevel=user_stacklevel(),
            )

    def chain(self, *, run_previous: bool = True) -> None:
        """After the pre-emption save: forget the record and run the Python handler that was
        installed before for the recorded signal (unless ``run_previous`` is False). From
        now on a watched signal with a default disposition never ends the process with it."""
        sig, self.received = self.received, None
        self.served = True
        if sig is not None and run_previous:
            previous = self._installed.get(sig, (None, None))[1]
            if callable(previous):
                previous(int(sig), None)

    def close(self) -> None:
        """Put back the earlier handlers where the watch's are still installed; a signal
        recorded but not served then gets what the earlier disposition gives it."""
        if self.closed:
            return
        self.closed = True
        pending, self.received = self.received, None
        for sig, (handle, previous) in self._installed.items():
            if signal.getsignal(sig) is handle:
                signal.signal(sig, self._after(previous))
        if pending is not None:
            previous = self._installed[pending][1]
            if not (self.served and not callable(previous)):  # the default ends the process
                _pass_on(pending, previous, None)

    def _after(self, previous: Handler) -> Handler:
        """What a watched signal gets when the watch closes."""
        if self.served and (previous is None or previous == signal.SIG_DFL):
            return ignore_after_preemption
        return previous if previous is not None else signal.SIG_DFL


def preempt(watch: SignalWatch | None, wait_writer: Callable[[], None], save: Callable[[], T]) -> T:
    """A watched signal came (here, ``watch``, or on another rank): ``save()`` now, after
    any background save (``wait_writer``: its failure is raised once this state is safe);
    then the handler that was installed before runs (not after such a failure)."""
    failure: BaseException | None = None
    try:
        wait_writer()
    except Exception as exc:
        failure = exc
    saved = save()
    if watch is not None:  # the previous handler runs once this state is safe
        watch.chain(run_previous=failure is None)
    if failure is not None:
        raise failure
    return saved
