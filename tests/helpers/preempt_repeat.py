"""A run pre-empted by SIGTERM that its launcher sends again, at the moments the test names.

Run as ``python -m tests.helpers.preempt_repeat RUN_DIR MIRROR_DIR WHEN...`` where each WHEN
is one moment of a repeated SIGTERM:

- ``after_save``: after the pre-emption save, before ``close()`` (sent by the test, which
  waits for the line ``saved``, signals, then writes a line on stdin);
- ``during_close``: while ``close()`` waits for the upload to the mirror (the uploader's
  thread sends it to this process as it begins the upload, which waits for ``close()``);
- ``after_close``: after ``close()``, before ``sys.exit`` (sent to this process).

The first SIGTERM is the test's, after the line ``ready``. The run then exits as the
documented recipe does: ``sys.exit(ckpt.PREEMPTED_EXIT_CODE)``, after printing ``closed``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import torch

import statekeeper as sk
from statekeeper.storage.local import LocalStorage

_closing = threading.Event()


class _SignalsWhenUploading(LocalStorage):
    """A mirror whose upload waits for ``close()`` and then sends this process a SIGTERM."""

    signal_during_close = False

    def begin(self, entry: str, *, replace: bool = False) -> Any:
        if threading.current_thread() is not threading.main_thread():
            if not _closing.wait(120):
                raise RuntimeError("close() was never called")
            if self.signal_during_close:
                os.kill(os.getpid(), signal.SIGTERM)  # the main thread is inside close()
        return super().begin(entry, replace=replace)


def main() -> None:
    run, mirror_dir, *when = sys.argv[1:]
    mirror = _SignalsWhenUploading(mirror_dir)
    mirror.signal_during_close = "during_close" in when
    model = torch.nn.Linear(3, 2)
    ckpt = sk.Checkpointer(run, every=sk.OnSignal(signal.SIGTERM), mirror=sk.Mirror(mirror))
    print("ready", flush=True)
    sys.stdin.readline()  # the test has sent the first SIGTERM by now
    step = 0
    while not ckpt.preempted and step < 1000:
        step += 1
        ckpt.maybe_save(step, {"model": model})
    print(f"saved {step}", flush=True)
    sys.stdin.readline()  # with after_save, the test has sent the next SIGTERM by now
    _closing.set()
    ckpt.close()
    if "after_close" in when:
        os.kill(os.getpid(), signal.SIGTERM)
    print("closed", flush=True)
    sys.exit(ckpt.PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
    main()
