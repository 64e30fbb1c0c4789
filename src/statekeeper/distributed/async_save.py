"""Background saves in a multi-process job.

Each rank's caller waits for the previous save (raising its error, on every rank alike),
begins the step with the others (rank 0 takes the lock and opens the transaction), captures
its state and copies every tensor it would write into host buffers of its own: the local
shard of a ``DTensor`` (re-wrapped with the same mesh and placements, so DCP plans the same
chunks), and plain tensors whole. The buffers are kept and reused while the layout repeats.
Then a background thread writes this rank's files, runs DCP's planning and writes over a
second gloo group (:func:`~statekeeper.distributed.group.background_group`, never the one
the training loop's thread uses meanwhile), gathers what every rank wrote, and rank 0
commits. Every rank learns the outcome; a failure on any rank is kept and raised by each
rank's next save, ``wait()`` or ``close()``. The staged copy is a snapshot: the loop may
change parameters as soon as the call returns.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from statekeeper.checkpoint.async_save import AsyncWriter, PendingSave
from statekeeper.checkpoint.info import CheckpointInfo
from statekeeper.checkpoint.options import SaveOptions
from statekeeper.distributed.group import background_group
from statekeeper.distributed.save import (
    Begun,
    Captured,
    capture_step,
    captured_alike,
    write_captured,
)
from statekeeper.distributed.state import split
from statekeeper.state.tree import Flat
from statekeeper.storage.base import Storage

__all__ = ["JobWriter"]


class JobWriter(AsyncWriter):
    """One background save of this rank at a time, with host buffers reused between saves."""

    def __init__(self) -> None:
        super().__init__()
        self._buffers: dict[str, torch.Tensor] = {}

    def _copy(self, name: str, t: torch.Tensor) -> torch.Tensor:
        local = t.to_local() if isinstance(t, DTensor) else t
        local = local.detach()
        buf = self._buffers.get(name)
        if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
            buf = torch.empty(local.shape, dtype=local.dtype, pin_memory=local.is_cuda)
            self._buffers[name] = buf
        buf.copy_(local, non_blocking=local.is_cuda)
        if not isinstance(t, DTensor):
            return buf
        return DTensor.from_local(
            buf, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride()
        )

    def _stage_flat(self, flat: Flat) -> Flat:
        staged = Flat(flat.skeleton, {n: self._copy(n, t) for n, t in flat.tensors.items()})
        if any(t.is_cuda for t in flat.tensors.values()):
            torch.cuda.synchronize()  # the non-blocking copies into pinned memory are done
        return staged

    def submit_job(
        self,
        storage: Storage,
        state: Mapping[str, Any],
        *,
        step: int,
        metrics: Mapping[str, Any] | None,
        options: SaveOptions,
        on_commit: Callable[[CheckpointInfo], None] | None = None,
    ) -> PendingSave:
        """Stage this rank's state and write the step in the background (every rank)."""
        self.wait()
        parts = split(state)
        begun = Begun(storage, step, options)
        try:
            group = background_group()

            def stage() -> Captured:
                captured = capture_step(parts, begun.rank)
                per_rank, shared = captured.per_rank, captured.shared
                return Captured(self._stage_flat(per_rank), self._stage_flat(shared))

            staged = [captured_alike(begun, stage, step)]
        except BaseException:
            begun.end(failed=True)
            raise
        pending = PendingSave(self, step)

        def run() -> None:
            failed = True
            try:
                info = write_captured(begun, group, staged[0], step, metrics, options)
                failed = False
                if on_commit is not None:
                    on_commit(info)
                pending._info = info
            except BaseException as exc:  # kept and raised by this rank's next call
                traceback.clear_frames(exc.__traceback__)
                pending._error = exc
            finally:
                staged.clear()
                begun.end(failed=failed)
                pending._done.set()

        self._pending = self._unreported = pending
        threading.Thread(target=run, name=f"statekeeper-job-save-{step}", daemon=False).start()
        return pending
