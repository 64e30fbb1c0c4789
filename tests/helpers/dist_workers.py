"""Worker processes for the distributed tests: each runs one scenario on one gloo rank.

Run as ``python -m tests.helpers.dist_workers SCENARIO RANK WORLD PORT RUN_DIR OUT_DIR``.
Every rank writes ``OUT_DIR/<scenario>-<rank>.json`` with what it observed; rank 0 also
writes full tensors to ``OUT_DIR/<scenario>.safetensors``. The tests compare those files.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torchdata.stateful_dataloader import StatefulDataLoader

import statekeeper as sk
from statekeeper.distributed.group import checkpoint_group
from statekeeper.loop import saving as saving_module

STEPS_BEFORE = 3
STEPS_AFTER = 3


def fsdp_model(world: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 12), torch.nn.ReLU(),
        torch.nn.Linear(12, 4),
    )  # fmt: skip
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def ddp_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))


def make_loader(world: int, rank: int) -> StatefulDataLoader:
    """Each rank reads its own part of the data, in an order that resumes exactly."""
    sampler = sk.data.ResumableSampler(range(64), seed=3, num_replicas=world, rank=rank)
    return StatefulDataLoader(range(64), batch_size=2, sampler=sampler)


def next_batch(it: Any) -> list[int]:
    return [int(i) for i in next(it)]


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8)  # differs per rank: drawn from each rank's own RNG
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def full(t: Any) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Full (unsharded) parameters and Adam moments, keyed by parameter name (collective)."""
    out = {f"param/{n}": full(p) for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{key}/{names[id(p)]}"] = full(st[key])
    return out


def report(out: Path, scenario: str, rank: int, data: dict[str, Any]) -> None:
    (out / f"{scenario}-{rank}.json").write_text(json.dumps(data))


def state_of(model: torch.nn.Module, opt: torch.optim.Optimizer, counter: dict[str, int]) -> Any:
    return {"model": model, "optim": opt, "rng": sk.RNGState(), "progress": counter}


def app_state(
    model: torch.nn.Module, opt: torch.optim.Optimizer, counter: Any, loader: Any
) -> Any:  # the Checkpointer adds "rng"
    state = {"model": model, "optim": opt, "progress": counter, "loader": loader}
    return {k: v for k, v in state.items() if v is not None}


def save_then_continue(rank: int, world: int, run: Path, out: Path) -> None:
    """Train, save at STEPS_BEFORE, keep training; record everything a resume must match."""
    model = fsdp_model(world, seed=0)
    torch.manual_seed(1000 + rank)  # data differs per rank
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    loader = make_loader(world, rank)
    it = iter(loader)
    with sk.Checkpointer(run, keep=sk.KeepLatest(1)) as ckpt:
        train(model, opt, STEPS_BEFORE - 1)
        next_batch(it)
        ckpt.save(STEPS_BEFORE - 1, app_state(model, opt, {"step": STEPS_BEFORE - 1}, loader))
        train(model, opt, 1)
        next_batch(it)
        info = ckpt.save(STEPS_BEFORE, app_state(model, opt, {"step": STEPS_BEFORE}, loader))
    batches = [next_batch(it) for _ in range(3)]
    at_save = snapshot(model, opt)
    next_draw = torch.rand(3).tolist()  # what this rank's RNG gives right after the save
    losses = train(model, opt, STEPS_AFTER)
    final = snapshot(model, opt)
    if rank == 0:
        save_file({**{f"save/{k}": v for k, v in at_save.items()},
                   **{f"final/{k}": v for k, v in final.items()}},
                  str(out / "reference.safetensors"))  # fmt: skip
    report(
        out,
        "save",
        rank,
        {"losses": losses, "draw": next_draw, "batches": batches, "bytes": info.bytes},
    )


def resume(rank: int, world: int, run: Path, out: Path) -> None:
    """Fresh objects (other seeds), load, continue: must match the reference bit for bit."""
    model = fsdp_model(world, seed=5)
    torch.manual_seed(77 + rank)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    if world == 2:
        train(model, opt, 1)  # live optimizer state exists and differs before the load
    else:  # never stepped, but holding gradients: its state must still be loadable
        model(torch.randn(4, 8)).sum().backward()
    counter = {"step": 0}
    loader = make_loader(world, rank)
    with sk.Checkpointer(run) as ckpt:
        step = ckpt.restore_latest(app_state(model, opt, counter, loader))
    loaded = snapshot(model, opt)
    data: dict[str, Any] = {"step": step, "counter": counter["step"]}
    group = checkpoint_group()
    data["dedicated_group"] = group is not dist.group.WORLD and dist.get_backend(group) == "gloo"
    tensors = {f"save/{k}": v for k, v in loaded.items()}
    if world == 2:  # same world: the run continues exactly (same draws, data, losses)
        it = iter(loader)
        data["batches"] = [next_batch(it) for _ in range(3)]
        data["draw"] = torch.rand(3).tolist()
        data["losses"] = train(model, opt, STEPS_AFTER)
        tensors.update({f"final/{k}": v for k, v in snapshot(model, opt).items()})
    if rank == 0:
        save_file(tensors, str(out / f"resume{world}.safetensors"))
    report(out, f"resume{world}", rank, data)


def resume_dcp(rank: int, world: int, run: Path, out: Path) -> None:
    """``resume`` through DCP's own load (the path for tensors the local planner cannot
    place), reported under ``OUT_DIR/dcp/``."""
    import statekeeper.distributed.load as load_module
    import statekeeper.distributed.read_plan as read_plan

    # (typing) an internal function the test drives or wraps
    read_plan.local_box = lambda t: None  # type: ignore[attr-defined]  # no local plan
    through_dcp = load_module._read_dcp
    calls: list[int] = []

    def counted(*args: Any) -> None:
        calls.append(1)
        through_dcp(*args)

    # (typing) a value of another type, on purpose: what the library does with it is tested
    load_module._read_dcp = counted  # type: ignore[assignment]
    (out / "dcp").mkdir(exist_ok=True)
    resume(rank, world, run, out / "dcp")
    report(out / "dcp", f"dcp-calls{world}", rank, {"calls": len(calls)})


def async_saves(rank: int, world: int, run: Path, out: Path) -> None:
    """Background saves of a job: step 1 committed; step 2 staged, then the parameters
    change at once (a snapshot must be written); a fresh job loads step 2 exactly."""
    model = fsdp_model(world, seed=0)
    torch.manual_seed(40 + rank)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    counter = {"step": 0}
    with sk.Checkpointer(run, blocking=False) as ckpt:
        train(model, opt, 1)
        first = ckpt.save(1, app_state(model, opt, counter, None))
        train(model, opt, 1)
        counter["step"] = 2
        staged = snapshot(model, opt)
        pending = ckpt.save(2, app_state(model, opt, counter, None))  # waits for step 1
        train(model, opt, 2)  # right away: the background write must not see this
        info = pending.wait()
    fresh = fsdp_model(world, seed=9)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.05)
    train(fresh, fresh_opt, 1)
    got = {"step": 0}
    sk.load(run, app_state(fresh, fresh_opt, got, None) | {"rng": sk.RNGState()})
    loaded = snapshot(fresh, fresh_opt)
    if rank == 0:
        save_file({f"staged/{k}": v for k, v in staged.items()}, str(out / "async.safetensors"))
        save_file({f"loaded/{k}": v for k, v in loaded.items()}, str(out / "async-l.safetensors"))
    data = {"steps": [c.step for c in sk.list_checkpoints(run)], "info": info.step}
    data["pending_type"] = type(first).__name__
    report(out, "async", rank, data | {"counter": got["step"]})


def async_failure(rank: int, world: int, run: Path, out: Path) -> None:
    """Rank 1's background write fails: both ranks learn it at their next call; nothing is
    committed past step 1."""
    import statekeeper.distributed.save as save_module

    model = fsdp_model(world, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    errors: list[str] = []
    with sk.Checkpointer(run, blocking=False) as ckpt:
        train(model, opt, 1)
        ckpt.save(1, app_state(model, opt, {"step": 1}, None))
        ckpt.wait()
        if rank == 1:
            # (typing) an internal function the test drives or wraps
            real = save_module.write_shard  # type: ignore[attr-defined]

            def broken(*args: Any, **kwargs: Any) -> Any:
                raise OSError(28, "No space left on device (injected)")

            # (typing) an internal function the test drives or wraps
            save_module.write_shard = broken  # type: ignore[attr-defined]
        pending = ckpt.save(2, app_state(model, opt, {"step": 2}, None))
        try:
            ckpt.wait()
        except Exception as exc:
            errors.append(type(exc).__name__)
        assert pending.done()
        if rank == 1:
            # (typing) an internal function the test drives or wraps
            save_module.write_shard = real  # type: ignore[attr-defined]
        info = ckpt.save(3, app_state(model, opt, {"step": 3}, None))  # the job goes on
        info.wait()
    report(
        out,
        "async_failure",
        rank,
        {"errors": errors, "steps": [c.step for c in sk.list_checkpoints(run)]},
    )


class _Flaky:
    """A per-rank entry whose ``state_dict()`` fails while ``broken`` is set."""

    def __init__(self) -> None:
        self.broken = False

    def state_dict(self) -> dict[str, Any]:
        if self.broken:
            raise UnicodeError("this rank's entry cannot be captured (injected)")
        return {"n": 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def async_refused(rank: int, world: int, run: Path, out: Path) -> None:
    """Background saves that fail before anything is written: rank 1's state cannot be
    captured, then a step that exists already; every rank learns each at its wait(). The
    job goes on after both."""
    model = fsdp_model(world, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    flaky = _Flaky()
    state = app_state(model, opt, {"step": 0}, None) | {"flaky": sk.distributed.PerRank(flaky)}
    seen: dict[str, list[str]] = {"at_call": [], "at_wait": []}

    def attempt(step: int) -> None:
        try:
            pending = ckpt.save(step, state)
        except Exception as exc:
            seen["at_call"].append(type(exc).__name__)
            return
        try:
            pending.wait()
        except Exception as exc:
            seen["at_wait"].append(type(exc).__name__)

    with sk.Checkpointer(run, blocking=False) as ckpt:
        train(model, opt, 1)
        ckpt.save(1, state).wait()
        flaky.broken = rank == 1
        attempt(2)
        flaky.broken = False
        attempt(1)  # committed already
        ckpt.save(3, state).wait()  # the job goes on: no collective was left unmatched
    steps = [c.step for c in sk.list_checkpoints(run)]
    report(out, "async_refused", rank, seen | {"steps": steps})


class _Recorder:
    """A per-rank entry that saves the step it was told."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]


def async_no_wait(rank: int, world: int, run: Path, out: Path) -> None:
    """A loop that never calls wait(): rank 1's capture fails at step 2; every rank's next
    save raises it; every step committed holds each rank's state of that very step."""
    model = fsdp_model(world, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    recorder, flaky = _Recorder(), _Flaky()
    state = app_state(model, opt, {"step": 0}, None)
    state |= {"recorder": sk.distributed.PerRank(recorder), "flaky": sk.distributed.PerRank(flaky)}
    errors: list[list[Any]] = []
    with sk.Checkpointer(run, blocking=False) as ckpt:
        for step in range(1, 6):
            train(model, opt, 1)
            recorder.step = step
            flaky.broken = rank == 1 and step == 2
            try:
                ckpt.save(step, state)
            except Exception as exc:
                errors.append([step, type(exc).__name__])
    steps = [c.step for c in sk.list_checkpoints(run)]
    found = {}
    for step in steps:
        got = _Recorder()
        sk.load(run, {"recorder": sk.distributed.PerRank(got)}, step=step, strict=sk.Strict.PARTIAL)
        found[step] = got.step
    report(out, "async_no_wait", rank, {"errors": errors, "steps": steps, "found": found})


def async_writers(rank: int, world: int, run: Path, out: Path) -> None:
    """Two background writers of one job at once (a Checkpointer with retention and a one-off
    save into another directory), then a failure after the commit on rank 0 only (in the
    step's on-commit work; retention itself only warns): every rank learns it, and the job
    goes on."""
    model = fsdp_model(world, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    state = app_state(model, opt, {"step": 0}, None)
    errors: list[str] = []
    with sk.Checkpointer(run / "a", blocking=False, keep=sk.KeepLatest(1)) as ckpt:
        pending = []
        for step in (1, 2):
            train(model, opt, 1)
            ckpt.save(step, state)
            pending.append(sk.save(run / "b", state, step=step, blocking=False))  # in flight
        ckpt.wait()
        for one in pending:
            one.wait()
        sk.save(run / "b", state, step=3, blocking=False).wait()
        real = ckpt._saves._retention
        if rank == 0:

            def broken(info: object) -> None:
                raise OSError(5, "on-commit work failed (injected)")

            # (typing) a test double stands in for the method in this test, put back after
            ckpt._saves._retention = broken  # type: ignore[method-assign]
        ckpt.save(3, state)
        try:
            ckpt.wait()
        except Exception as exc:
            errors.append(type(exc).__name__)
        # (typing) a test double stands in for the method in this test, put back after
        ckpt._saves._retention = real  # type: ignore[method-assign]
        ckpt.save(4, state).wait()  # the job goes on: no collective was left unmatched
    steps = {d: [c.step for c in sk.list_checkpoints(run / d)] for d in ("a", "b")}
    report(out, "async_writers", rank, {"steps": steps, "errors": errors})


def killed(rank: int, world: int, run: Path, out: Path, background: bool = False) -> None:
    """Commit step 1, then rank 1 dies in the middle of writing step 2 (in the background
    with ``background``: ``save(blocking=False)``, then ``wait()``)."""
    model = fsdp_model(world, seed=0)
    torch.manual_seed(rank)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    train(model, opt, 1)
    sk.save(run, state_of(model, opt, {"step": 1}), step=1)
    train(model, opt, 1)
    if rank == 1:
        from statekeeper.distributed import dcp_storage

        def die(*args: Any, **kwargs: Any) -> Any:
            os.kill(os.getpid(), signal.SIGKILL)  # a hard kill, mid-save

        # (typing) a test double stands in for the method in this test, put back after
        dcp_storage.ChunkWriter.write_data = die  # type: ignore[method-assign]
    try:
        if background:
            sk.save(run, state_of(model, opt, {"step": 2}), step=2, blocking=False).wait()
        else:
            sk.save(run, state_of(model, opt, {"step": 2}), step=2)
        outcome = "saved"
    except Exception as exc:  # rank 0 must see the failure, not hang and not commit
        outcome = f"{type(exc).__name__}: {exc}"
    report(out, "killed_async" if background else "killed", rank, {"outcome": outcome})
    os._exit(0)  # the group is broken: skip destroy_process_group


def ddp(rank: int, world: int, run: Path, out: Path) -> None:
    model = ddp_model(seed=0)
    torch.manual_seed(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fresh = torch.optim.Adam(model.parameters(), lr=0.1)  # never stepped
    sk.save(run / "fresh", {"model": model, "optim": fresh}, step=0)
    data: dict[str, Any] = {"fresh_after_save": len(fresh.state)}  # a save must not step it
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    stats = {"rank": torch.tensor([float(rank)])}  # differs per rank: replicated means rank 0's
    info = sk.save(
        run, {"model": model, "optim": opt, "rng": sk.RNGState(), "stats": stats}, step=1
    )
    data["bytes"] = info.bytes
    fresh.step()  # now it has state; loading the never-stepped checkpoint clears it again
    sk.load(run / "fresh", {"model": model, "optim": fresh})
    data["fresh_after_load"] = len(fresh.state)
    report(out, "ddp", rank, data)


def faults(rank: int, world: int, run: Path, out: Path) -> None:
    """Failures on one rank only: every rank must fail (or skip) alike, never hang."""
    model = fsdp_model(world, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    train(model, opt, 1)
    data: dict[str, Any] = {}
    sk.save(run, app_state(model, opt, {"step": 1}, None), step=1)
    sk.save(run, app_state(model, opt, {"step": 2}, None), step=2)
    # (a) rank 1 cannot open rank 0's in-progress entry (a shared file system lagging)
    real_attach = sk.storage.LocalStorage.attach
    if rank == 1:

        def refuse(self: Any, entry: str) -> Any:
            raise sk.errors.StorageError(5, f"{entry} is not visible here yet")

        # (typing) a test double stands in for the method in this test, put back after
        sk.storage.LocalStorage.attach = refuse  # type: ignore[method-assign]
    try:
        sk.save(run, app_state(model, opt, {"step": 3}, None), step=3)
        data["attach"] = "saved"
    except Exception as exc:
        data["attach"] = type(exc).__name__
    # (typing) a test double stands in for the method in this test, put back after
    sk.storage.LocalStorage.attach = real_attach  # type: ignore[method-assign]
    data["steps_after_attach"] = [i.step for i in sk.list_checkpoints(run)]
    # (b) the ranks' clocks disagree about EverySeconds: rank 0 decides for both
    ticks = iter([0.0, 100.0 if rank == 0 else 10.0, 200.0])
    saving_module._clock, real_clock = lambda: next(ticks), saving_module._clock
    with sk.Checkpointer(run, every=sk.EverySeconds(60)) as ckpt:
        saved = ckpt.maybe_save(4, app_state(model, opt, {"step": 4}, None))
        data["policy"] = None if saved is None else saved.step
    saving_module._clock = real_clock
    # (c) a mismatch on rank 1 only: every rank raises, none skips to an older step
    other = fsdp_model(world, seed=0) if rank == 0 else torch.nn.Linear(3, 3)
    with sk.Checkpointer(run) as ckpt:
        try:
            ckpt.restore_latest({"model": other})
            data["mismatch"] = "loaded"
        except Exception as exc:
            data["mismatch"] = type(exc).__name__
    dist.barrier()
    # (d) the newest step is damaged: every rank skips it and loads the one before
    if rank == 0:
        chunk = run / "step_000000004" / "chunks-00001.safetensors"
        damaged = bytearray(chunk.read_bytes())
        damaged[-2] ^= 0xFF
        chunk.write_bytes(bytes(damaged))
    dist.barrier()
    with sk.Checkpointer(run) as ckpt:
        data["fallback"] = ckpt.restore_latest(app_state(model, opt, {"step": 0}, None))
    report(out, "faults", rank, data)


SCENARIOS = {
    "save": save_then_continue,
    "resume": resume,
    "resume_dcp": resume_dcp,
    "async_saves": async_saves,
    "async_failure": async_failure,
    "async_writers": async_writers,
    "async_refused": async_refused,
    "async_no_wait": async_no_wait,
    "killed_async": lambda rank, world, run, out: killed(rank, world, run, out, background=True),
    "killed": killed,
    "ddp": ddp,
    "faults": faults,
}


def main() -> None:
    scenario, rank, world, port, run, out = sys.argv[1:7]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group(
        "gloo", rank=int(rank), world_size=int(world), timeout=timedelta(seconds=60)
    )
    SCENARIOS[scenario](int(rank), int(world), Path(run), Path(out))
    dist.destroy_process_group()
    # torch keeps objects owning gloo threads (device meshes, FSDP state) past
    # destroy_process_group; their teardown with the interpreter can abort a finished rank
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
