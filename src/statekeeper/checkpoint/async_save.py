"""Asynchronous saving: the caller waits only while the tensors are copied to host buffers.

``AsyncWriter.submit`` runs in the caller: it waits for the previous save (one in flight at
a time, so two saves never interleave), raises that save's error if it failed, captures and
plans the new state, and copies every stored tensor into a staging buffer (pinned host
memory when any tensor is on CUDA) that the next save of the same writer reuses (or that is
freed once the step is written: :class:`Staging`). A background
thread then streams the shards from the staging buffer, writes the manifest, commits and
calls ``on_commit`` (retention). Its error is kept and raised by the next ``submit``, by
``wait()`` and by ``close()``, never lost. The staged copy is a snapshot: the training loop
may change the model as soon as ``submit`` returns.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import torch

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.checkpoint.gc_pause import collector_paused
from statekeeper.checkpoint.options import SaveOptions
from statekeeper.checkpoint.pending import Outcome, PendingSave
from statekeeper.checkpoint.plan_cache import Plan, PlanCache
from statekeeper.checkpoint.writer import Prepared, check_step, commit, prepare
from statekeeper.errors import InvalidArgumentError
from statekeeper.lanes import lane
from statekeeper.storage.base import Storage

__all__ = ["AsyncWriter", "PendingSave", "Staging"]

_ALIGN = 64


@dataclass(frozen=True)
class _Staged:
    """The staging views of one tensor layout and the names of the non-empty tensors."""

    key: tuple[object, ...]
    plan: Plan | None
    on_cuda: bool
    views: dict[str, torch.Tensor]
    copied: tuple[str, ...]


class Staging(StrEnum):
    """What a writer does with its staging buffer once a save is written.

    - ``REUSE``: keep it for the next save (a ``Checkpointer`` saving the same state again:
      no allocation, no page faults in the caller's stall);
    - ``RELEASE``: free it (a one-off ``save(..., blocking=False)``: nothing state-sized is
      kept once the step is committed).
    """

    REUSE = "reuse"
    RELEASE = "release"


class AsyncWriter:
    """One background save at a time, with staging buffers reused between saves."""

    def __init__(self, staging: Staging = Staging.REUSE) -> None:
        if not isinstance(staging, Staging):
            raise InvalidArgumentError(f"staging must be a Staging, got {staging!r}")
        self._release = staging is Staging.RELEASE
        self._pending: Outcome | None = None
        self._unreported: Outcome | None = None
        self._staging: torch.Tensor | None = None
        self._staged: _Staged | None = None
        self._plans = PlanCache()
        self._worker: ThreadPoolExecutor | None = None
        self._worker_pid = 0

    def _consume(self, outcome: Outcome) -> None:
        if self._unreported is outcome:
            self._unreported = None

    def wait(self) -> CheckpointInfo | None:
        """Wait for the save in flight; raise its error (once) if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.event.wait()
            pending.reported = True
        failed, self._unreported = self._unreported, None
        if failed is not None and failed.error is not None:
            failed.reported = True
            raise failed.error
        return None if pending is None else pending.info

    def prepare(
        self, captured: dict[str, Any], metrics: Mapping[str, Any] | None = None
    ) -> Prepared:
        """:func:`~statekeeper.checkpoint.writer.prepare` with this writer's plan cache: a
        state saved again with the same structure skips most of the per-tensor work."""
        with collector_paused():
            return prepare(captured, metrics, self._plans)

    def _views(self, prepared: Prepared) -> _Staged:
        """Views of the staging buffer shaped like the stored tensors; kept while the layout
        repeats (the same Plan object, or the same names, dtypes and shapes)."""
        stored = prepared.stored
        staged = self._staged
        if staged is not None and prepared.plan is not None and prepared.plan is staged.plan:
            return staged  # the same plan: the same names, dtypes, shapes and devices
        on_cuda = any(t.is_cuda for t in stored.values())
        key = tuple((n, t.dtype, tuple(t.shape)) for n, t in stored.items())
        pinned_ok = self._staging is not None and (self._staging.is_pinned() or not on_cuda)
        if staged is not None and key == staged.key and on_cuda == staged.on_cuda and pinned_ok:
            self._staged = _Staged(key, prepared.plan, on_cuda, staged.views, staged.copied)
            return self._staged
        sizes = {n: t.numel() * t.element_size() for n, t in stored.items()}
        offsets, total = {}, 0
        for name, size in sizes.items():
            offsets[name] = total
            total += -(-size // _ALIGN) * _ALIGN
        staging = self._staging
        if staging is None or staging.numel() < total or (on_cuda and not staging.is_pinned()):
            self._staging = self._staged = None  # the old buffer is freed before the new one
            staging = torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=on_cuda)
            self._staging = staging
        views: dict[str, torch.Tensor] = {}
        for name, t in stored.items():
            if t.numel() == 0:
                views[name] = torch.empty(t.shape, dtype=t.dtype)
            else:
                raw = staging[offsets[name] : offsets[name] + sizes[name]]
                views[name] = raw.view(t.dtype).view(t.shape)
        copied = tuple(n for n, t in stored.items() if t.numel())
        self._staged = _Staged(key, prepared.plan, on_cuda, views, copied)
        return self._staged

    def _stage(self, prepared: Prepared) -> dict[str, torch.Tensor]:
        staged = self._views(prepared)
        srcs = [prepared.stored[n] for n in staged.copied]
        if srcs:  # one fused call instead of one copy per tensor; no_grad: no detach needed
            dsts = [staged.views[n] for n in staged.copied]
            with torch.no_grad():
                torch._foreach_copy_(dsts, srcs, non_blocking=staged.on_cuda)
        if staged.on_cuda:
            torch.cuda.synchronize()
        return dict(staged.views)

    def submit(
        self,
        storage: Storage,
        prepared: Prepared,
        *,
        step: int,
        options: SaveOptions,
        lock: AbstractContextManager[None] | None = None,
        on_commit: Callable[[CheckpointInfo], None] | None = None,
    ) -> PendingSave:
        """Stage ``prepared`` and write it in the background (see the module docstring);
        ``lock`` is held by the background write until it ends."""
        self.wait()
        stack = ExitStack()
        if lock is not None:  # first: a refused save copies nothing into host memory
            stack.enter_context(lock)
        try:
            check_step(storage, step, options.overwrite)
            with collector_paused():  # boxed: dropped once written, even if a traceback stays
                snapshot = [replace(prepared, stored=self._stage(prepared))]
        except BaseException:
            stack.close()
            raise

        def work() -> CheckpointInfo:
            with stack:
                info = commit(storage, snapshot[0], step=step, options=options)
                if on_commit is not None:
                    on_commit(info)
            return info

        def cleanup() -> None:
            snapshot.clear()
            if self._release:
                self._staging = self._staged = None

        try:
            return self._background(storage.describe(), step, work, cleanup)
        except BaseException:
            stack.close()  # the lock, held for a write that never ran
            raise

    def _background(
        self,
        where: str,
        step: int,
        work: Callable[[], CheckpointInfo],
        cleanup: Callable[[], None],
    ) -> PendingSave:
        """Run ``work`` (write, commit, retention) on this writer's thread, then ``cleanup``.
        Its result or error goes to the PendingSave returned; an error is also kept for the
        caller's next call. The error's traceback stays, its frames' locals go: they would
        hold the staged tensors.

        A Checkpointer's thread is started once and kept until :meth:`close` (a one-off
        save's runs on the process's ``save`` lane): handing it a save costs
        the caller no thread start (which waits for the new thread to run: milliseconds on
        a loaded machine, inside the caller's stall). It is not a daemon: a save in flight
        when the interpreter exits is finished first. The thread holds the
        :class:`~.pending.Outcome`, never the ``PendingSave``: a one-off save's caller owns
        that alone (and is told when it drops it unwaited)."""
        outcome = Outcome(step, where)

        def run() -> None:
            try:
                outcome.info = work()
            except BaseException as exc:  # kept and raised on the caller's next call
                traceback.clear_frames(exc.__traceback__)
                outcome.error = exc
            finally:
                try:
                    cleanup()
                except BaseException as exc:  # reported, never a wait() that hangs
                    outcome.error = outcome.error or exc
                finally:
                    outcome.finish()

        try:
            # a one-off save runs on the process's save lane: a thread of its own would end
            # with the save, and one ending while the loop forks can hang the child
            # (statekeeper/lanes.py)
            (lane("save") if self._release else self._thread()).submit(run)
        except BaseException:  # the work never ran (a cancelled queue item never will)
            if not self._release:
                self._stop_thread(cancel=True)
            cleanup()  # nothing was written: the step is aborted, the lock released
            raise
        if not self._release:  # a Checkpointer's: its next save, wait() and close() report it
            self._pending = self._unreported = outcome
        return PendingSave(self, outcome, owned=self._release)

    def _thread(self) -> ThreadPoolExecutor:
        """This writer's thread, started on first use and again in a forked child (which
        inherits the executor but not its thread)."""
        if self._worker is None or self._worker_pid != os.getpid():
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="statekeeper-save")
            self._worker_pid = os.getpid()
        return self._worker

    def _stop_thread(self, *, cancel: bool) -> None:
        worker, self._worker = self._worker, None
        if worker is not None and self._worker_pid == os.getpid():
            worker.shutdown(wait=False, cancel_futures=cancel)

    def close(self) -> None:
        """Wait for the save in flight, stop this writer's thread, and raise the save's
        error, if any. A later save starts the thread again."""
        worker, self._worker = self._worker, None
        try:
            self.wait()
        finally:
            if worker is not None and self._worker_pid == os.getpid():
                worker.shutdown(wait=True)
