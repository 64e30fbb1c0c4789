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
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

from statekeeper.checkpoint.async_save import AsyncWriter, PendingSave, Staging
from statekeeper.checkpoint.info import CheckpointInfo
from statekeeper.checkpoint.options import SaveOptions
from statekeeper.distributed.group import agree, background_group
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

    def __init__(self, staging: Staging = Staging.REUSE) -> None:
        super().__init__(staging)
        self._buffers: dict[str, torch.Tensor] = {}
        self._wrapped: dict[str, tuple[tuple[object, ...], torch.Tensor]] = {}

    def _buffer(self, name: str, local: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(name)
        if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
            buf = torch.empty(local.shape, dtype=local.dtype, pin_memory=local.is_cuda)
            self._buffers[name] = buf
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
        """``flat`` with every tensor copied into this writer's buffers: one fused copy."""
        staged: dict[str, torch.Tensor] = {}
        dsts: list[torch.Tensor] = []
        srcs: list[torch.Tensor] = []
        for name, t in flat.tensors.items():
            local = (t.to_local() if isinstance(t, DTensor) else t).detach()
            buf = self._buffer(name, local)
            dsts.append(buf)
            srcs.append(local)
            staged[name] = self._wrap(name, t, buf) if isinstance(t, DTensor) else buf
        on_cuda = any(t.is_cuda for t in srcs)
        if dsts:
            with torch.no_grad():
                torch._foreach_copy_(dsts, srcs, non_blocking=on_cuda)
        if on_cuda:
            torch.cuda.synchronize()  # the copies into pinned memory are done
        return Flat(flat.skeleton, staged)

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
        _one_at_a_time.acquire()  # background collectives of two writers never interleave
        try:
            return self._submit(storage, state, step, metrics, options, on_commit)
        except BaseException:
            _one_at_a_time.release()
            raise

    def _submit(
        self,
        storage: Storage,
        state: Mapping[str, Any],
        step: int,
        metrics: Mapping[str, Any] | None,
        options: SaveOptions,
        on_commit: Callable[[CheckpointInfo], None] | None,
    ) -> PendingSave:
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
        failed = [True]

        def work() -> CheckpointInfo:
            info = write_captured(begun, group, staged[0], step, metrics, options)
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
                begun.end(failed=bool(failed))
            finally:
                if self._release:
                    self._buffers.clear()
                    self._wrapped.clear()
                _one_at_a_time.release()

        return self._background(step, work, cleanup, f"statekeeper-job-save-{step}")


_one_at_a_time = threading.Lock()
"""One background job save in flight per process: each runs collectives on the one
background group, which two threads must not use at once."""
