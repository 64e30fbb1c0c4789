"""How higher layers plug into the core without the core importing them.

The single-process core (``checkpoint``) asks two questions it cannot answer alone: how to
capture and restore a kind of state that a higher layer knows (torchdata's
``StatefulDataLoader``, ``data``'s loaders, ``distributed``'s ``PerRank``), and who runs a
save or load that the whole job takes part in (``distributed``). Higher layers answer by
registering with the core's tables (:mod:`statekeeper.checkpoint.adapters`,
:mod:`statekeeper.checkpoint.collective`).

Registration must happen before the first save or load, whatever the user imported. The
package root, which sits above every layer, hands this module one *installer* at import
time; the core calls :func:`install` before it consults a table. :func:`install` returns
only once every installer has run: a thread that arrives while another installs waits for
it, an installer that raises stays pending (the next call runs it again), and a call made
from inside an installer returns at once. This module imports nothing (it is below every
layer), and so never imports torch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["add_installer", "install"]

_pending: list[Callable[[], None]] = []
_lock = threading.RLock()
_installing = threading.local()


def add_installer(installer: Callable[[], None]) -> None:
    """Run ``installer`` (once) the next time the core consults its extension tables."""
    with _lock:
        _pending.append(installer)


def install() -> None:
    """Run the installers not run yet, in the order they were added."""
    if not _pending:  # the common case, without the lock
        return
    if getattr(_installing, "active", False):
        return  # called from an installer of this thread: its tables fill as it goes
    with _lock:
        _installing.active = True
        try:
            while _pending:
                _pending[0]()
                _pending.pop(0)  # only once it succeeded
        finally:
            _installing.active = False
