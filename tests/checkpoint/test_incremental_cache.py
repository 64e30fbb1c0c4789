"""What incremental saves remember belongs to an owner (a Checkpointer, an uploader, or
``sk.save``'s one cache); a forked child finds it empty and usable, with no fork hook, even
when one of the parent's threads held it at the fork."""

from __future__ import annotations

import os
import threading

from statekeeper.incremental.reuse import IncrementalCache


def test_a_forked_child_starts_with_an_empty_cache_even_if_a_thread_held_it() -> None:
    cache = IncrementalCache()
    cache.checked.set(("memory://run", "step_1/a.safetensors"), ("etag", "sum"))
    inside, release = threading.Event(), threading.Event()

    def hold(old: object) -> object:
        inside.set()
        release.wait(timeout=120)  # a hang guard only
        return old

    holder = threading.Thread(target=cache.seen.swap, args=("memory://run", hold))
    holder.start()
    assert inside.wait(timeout=120)  # the parent's thread holds the memo's lock now
    try:
        pid = os.fork()
        if pid == 0:  # the child: nothing of the parent's memory, and no lock held
            ok = cache.checked.get(("memory://run", "step_1/a.safetensors")) is None
            ok = ok and cache.seen.swap("memory://run", lambda old: {}) is None
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join(timeout=120)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cache.checked.get(("memory://run", "step_1/a.safetensors")) == ("etag", "sum")
