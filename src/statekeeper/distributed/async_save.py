"""Background saves in a multi-process job.

The caller runs no collective of its own (the two gloo groups are made by the first save):
each rank's caller waits for the previous save (raising its error, on every rank alike),
captures its state and copies every tensor it would write into host buffers of its own: the
local shard of a ``DTensor`` (re-wrapped with the same mesh and placements, so DCP plans the
same chunks), and plain tensors whole. The buffers are kept and reused while the layout
repeats. Its stall is that copy and the capture (plus the wait for the previous save, if it
is still running); it does not wait for a slower rank's capture.

Everything else runs on a background thread, over a second gloo group
(:func:`~statekeeper.distributed.group.background_group`, never the one the training loop's
thread uses meanwhile): rank 0 takes the lock and opens the step, every rank learns whether
every rank captured its state, writes its files and runs DCP's planning and writes, rank 0
commits after gathering what every rank wrote. Every rank learns the outcome; a failure on
any rank, a capture that failed included, is kept and raised by each rank's next save,
``wait()`` or ``close()``: at the same call on every rank. The staged copy is a snapshot:
the loop may change parameters as soon as the call returns.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

from statekeeper.catalog.info import CheckpointInfo
from statekeeper.checkpoint.async_save import AsyncWriter, PendingSave, Staging
from statekeeper.checkpoint.gc_pause import collector_paused
from statekeeper.checkpoint.request import SaveRequest
from statekeeper.distributed.group import agree, background_group, gather
from statekeeper.distributed.save import (
    Begun,
    Captured,
    capture_step,
    require_shared,
    write_captured,
)
from statekeeper.distributed.state import split
from statekeeper.errors import RankFailure
from statekeeper.state.tree import Flat
from statekeeper.storage.base import Storage

__all__ = ["JobWriter"]


class JobWriter(AsyncWriter):
    """One background save of this rank at a time, with host buffers reused between saves."""

    def __init__(self, staging: Staging = Staging.REUSE) -> None:
        super().__init__(staging)
        self._buffers: dict[str, torch.Tensor] = {}
        self._pinned: set[str] = set()  # the names whose buffer is pinned
        self._wrapped: dict[str, tuple[tuple[object, ...], torch.Tensor]] = {}

    def _buffer(self, name: str, local: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(name)
        if (
            buf is None
            or buf.shape != local.shape
            or buf.dtype != local.dtype
            or (local.is_cuda and name not in self._pinned)  # moved to a GPU since: pin it
        ):
            buf = torch.empty(local.shape, dtype=local.dtype, pin_memory=local.is_cuda)
            self._buffers[name] = buf
            (self._pinned.add if local.is_cuda else self._pinned.discard)(name)
        return buf

    def _wrap(self, name: str, t: DTensor, buf: torch.Tensor) -> torch.Tensor:
        """``buf`` itself as a DTensor like ``t`` (same mesh, placements, global shape and
        stride), kept while the buffer and the layout repeat. Built from its spec, not with
        ``from_local``, which would move a host buffer to a CUDA mesh's device (a copy)."""
        key = (id(buf), t.device_mesh, tuple(t.placements), tuple(t.shape), t.stride())
        known = self._wrapped.get(name)
        if known is not None and known[0] == key:
            return known[1]
        meta = TensorMeta(t.shape, t.stride(), t.dtype)
        spec = DTensorSpec(t.device_mesh, tuple(t.placements), tensor_meta=meta)
        wrapped = DTensor(buf, spec, requires_grad=False)  # type: ignore[no-untyped-call]
        if wrapped.to_local().data_ptr() != buf.data_ptr():  # pragma: no cover - torch changed
            raise RuntimeError("a staged DTensor does not wrap its host buffer")
        self._wrapped[name] = (key, wrapped)
        return wrapped

    def _stage_flat(self, flat: Flat) -> Flat:
        """``flat`` with every tensor copied into this writer's buffers: one fused copy.
        Under ``no_grad``: ``DTensor.to_local`` is then 30x cheaper (no autograd node)."""
        staged: dict[str, torch.Tensor] = {}
        dsts: list[torch.Tensor] = []
        srcs: list[torch.Tensor] = []
        with torch.no_grad():
            for name, t in flat.tensors.items():
                local = t.to_local() if isinstance(t, DTensor) else t
                buf = self._buffer(name, local)
                dsts.append(buf)
                srcs.append(local)
                staged[name] = self._wrap(name, t, buf) if isinstance(t, DTensor) else buf
            on_cuda = any(t.is_cuda for t in srcs)
            if dsts:
                torch._foreach_copy_(dsts, srcs, non_blocking=on_cuda)
        for device in {t.device for t in srcs if t.is_cuda}:
            torch.cuda.synchronize(device)  # the copies into pinned memory are done
        return Flat(flat.skeleton, staged)

    def submit_job(
        self,
        storage: Storage,
        state: Mapping[str, Any],
        request: SaveRequest,
    ) -> PendingSave:
        """Stage this rank's state and write ``request``'s step in the background (every
        rank).

        Every rank's failure, its own capture's included, is raised at the same point on
        every rank: by the returned save's ``wait()``, or the writer's next call. (Were the
        rank whose capture failed to raise at once, it would skip a ``wait()`` that raises
        on the others, and the ranks' background saves would pair different steps.)"""
        require_shared(storage)
        self.wait()
        _one_at_a_time.acquire()  # background collectives of two writers never interleave
        try:
            group = background_group()  # made by every rank's caller, the first time
        except BaseException:
            _one_at_a_time.release()
            raise
        staged: list[Captured] = []
        failure: BaseException | None = None
        try:
            with collector_paused():  # no full collection inside the stall (see gc_pause)
                parts = split(state)
                captured = capture_step(parts, dist.get_rank(group))
                per_rank, shared = (
                    self._stage_flat(captured.per_rank),
                    self._stage_flat(captured.shared),
                )
            staged.append(Captured(per_rank, shared))
        except Exception as exc:  # every rank learns of it in the background
            failure = exc
        except BaseException:  # KeyboardInterrupt and the like: this process stops here
            _one_at_a_time.release()
            raise
        return self._write_later(storage, group, staged, failure, request)

    def _write_later(
        self,
        storage: Storage,
        group: dist.ProcessGroup,
        staged: list[Captured],
        failure: BaseException | None,
        request: SaveRequest,
    ) -> PendingSave:
        """In the background, over ``group``: begin the step with the other ranks, check
        that every rank saves this step, agree that every rank captured its state, write,
        commit, apply retention."""
        begun: list[Begun] = []
        failed = [True]
        step, on_commit = request.step, request.on_commit

        def work() -> CheckpointInfo:
            begun.append(Begun(storage, step, request.options, group))
            steps = sorted(set(gather(step, group)))
            if len(steps) > 1:  # a safeguard: the ranks' saves must pair the same step
                raise RankFailure(
                    f"the ranks' background saves are out of step (steps {steps} at once); "
                    "nothing was committed. Call save() with the same step on every rank"
                )
            agree(failure, group, f"capturing the state of step {step}")
            info = write_captured(begun[0], group, staged[0], request)
            failed.clear()  # committed: what follows aborts nothing
            retention: BaseException | None = None
            try:
                if on_commit is not None:
                    on_commit(info)  # retention: work on rank 0 only
            except Exception as exc:
                retention = exc
            agree(retention, group, f"applying retention after step {step}")  # every rank
            return info

        def cleanup() -> None:
            staged.clear()
            try:
                if begun:
                    begun[0].end(failed=bool(failed))
            finally:
                if self._release:
                    self._buffers.clear()
                    self._pinned.clear()
                    self._wrapped.clear()
                _one_at_a_time.release()

        return self._background(storage.describe(), step, work, cleanup)


_one_at_a_time = threading.Lock()
"""One background job save in flight per process: each runs collectives on the one
background group, which two threads must not use at once."""
