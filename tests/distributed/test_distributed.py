"""Multi-process saves and loads: real gloo process groups, one spawned process per rank.

The scenarios themselves live in tests/helpers/dist_workers.py; these tests launch them and
compare what the ranks report (losses, RNG draws, full tensors) bit for bit.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests.helpers import launcher

import statekeeper as sk
from statekeeper.cli.main import main as cli

ROOT = Path(__file__).resolve().parents[2]

# one xdist worker runs all of them: two jobs launched at once could race for a free port
pytestmark = pytest.mark.xdist_group("gloo")


def launch(scenario: str, world: int, run: Path, out: Path) -> list[int]:
    """Run ``scenario`` on ``world`` ranks; their exit codes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "tests.helpers.dist_workers", scenario]
    procs = [
        launcher.Popen([*args, str(r), str(world), str(port), str(run), str(out)], cwd=ROOT)
        for r in range(world)
    ]
    try:
        return [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()


def reports(out: Path, scenario: str, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"{scenario}-{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 2-rank FSDP2 run saved at step 3, then continued: its reference results."""
    run = tmp_path_factory.mktemp("run")
    out = tmp_path_factory.mktemp("out")
    assert launch("save", 2, run, out) == [0, 0]
    return run, out


def plain_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 12), torch.nn.ReLU(),
        torch.nn.Linear(12, 4),
    )  # fmt: skip


def test_sharded_step_layout(saved: tuple[Path, Path]) -> None:
    run, out = saved
    step = run / "step_000000003"
    assert sorted(p.name for p in run.iterdir()) == [".statekeeper.lock", "step_000000003"]
    files = sorted(p.name for p in step.iterdir())
    assert files == [
        "chunks-00000.safetensors", "chunks-00001.safetensors", "manifest.json",
        "rank-00000.safetensors", "rank-00001.safetensors",
    ]  # fmt: skip
    manifest = json.loads((step / "manifest.json").read_text())
    assert manifest["version"] == 2
    assert len(manifest["ranks"]) == 2
    weight = manifest["sharded"]["model/0.weight"]
    assert weight["shape"] == [16, 8]
    assert [c["offsets"] for c in weight["chunks"]] == [[0, 0], [8, 0]]
    assert not list(run.glob("*.metadata")) and not list(step.glob(".metadata"))
    saves = reports(out, "save", 2)
    assert saves[0]["draw"] != saves[1]["draw"]  # each rank's RNG is its own
    assert saves[0]["batches"] != saves[1]["batches"]  # and its own part of the data


def test_world_2_resumes_bit_for_bit(saved: tuple[Path, Path]) -> None:
    run, out = saved
    assert launch("resume", 2, run, out) == [0, 0]
    reference = load_file(str(out / "reference.safetensors"))
    resumed = load_file(str(out / "resume2.safetensors"))
    assert set(resumed) == set(reference)
    for key, value in resumed.items():
        assert torch.equal(value, reference[key]), key
    for before, after in zip(reports(out, "save", 2), reports(out, "resume2", 2), strict=True):
        assert after["step"] == 3 and after["counter"] == 3  # Checkpointer.restore_latest
        assert after["draw"] == before["draw"]  # per-rank RNG restored on its own rank
        assert after["batches"] == before["batches"]  # and each rank's data position
        assert after["losses"] == before["losses"]  # training continues identically
        assert after["dedicated_group"] is True


def test_world_4_reshards(saved: tuple[Path, Path]) -> None:
    run, out = saved
    assert launch("resume", 4, run, out) == [0, 0, 0, 0]
    reference = load_file(str(out / "reference.safetensors"))
    resumed = load_file(str(out / "resume4.safetensors"))
    assert resumed  # parameters and both Adam moments
    for key, value in resumed.items():
        assert torch.equal(value, reference[key]), key
    assert all(r["counter"] == 3 for r in reports(out, "resume4", 4))


@pytest.mark.parametrize("world", [2, 4])
def test_the_dcp_read_path_loads_the_same_bits(saved: tuple[Path, Path], world: int) -> None:
    """The load that DCP plans (for tensors the local planner cannot place) reads the same
    values as the local one, in the same world and resharded."""
    run, out = saved
    assert launch("resume_dcp", world, run, out) == [0] * world
    reference = load_file(str(out / "reference.safetensors"))
    resumed = load_file(str(out / "dcp" / f"resume{world}.safetensors"))
    assert resumed
    for key, value in resumed.items():
        assert torch.equal(value, reference[key]), key
    assert all(r["counter"] == 3 for r in reports(out / "dcp", f"resume{world}", world))
    assert all(r["calls"] == 1 for r in reports(out / "dcp", f"dcp-calls{world}", world))


def test_world_1_dtensor_model_loads_a_sharded_step(saved: tuple[Path, Path]) -> None:
    """FSDP2 in a process group of one: the DTensor state goes the distributed way (it
    failed with "got mixed torch.Tensor and DTensor" after earlier entries were applied)."""
    run, out = saved
    assert launch("resume", 1, run, out) == [0]
    reference = load_file(str(out / "reference.safetensors"))
    resumed = load_file(str(out / "resume1.safetensors"))
    assert resumed
    for key, value in resumed.items():
        assert torch.equal(value, reference[key]), key
    (report,) = reports(out, "resume1", 1)
    assert report["step"] == 3 and report["counter"] == 3


def test_world_1_reads_and_loads_a_sharded_step(saved: tuple[Path, Path]) -> None:
    run, out = saved
    reference = load_file(str(out / "reference.safetensors"))
    model = plain_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    counter = {"step": 0}
    rng = sk.RNGState()
    live = {"model": model, "optim": opt, "rng": rng, "progress": counter}
    with pytest.raises(sk.KeyMismatchError, match="loader"):
        sk.load(run, live)  # the step holds rank 0's data-loader position too
    sk.load(run, live, strict=sk.Strict.ALLOW_UNEXPECTED)  # a new world size: new loaders
    assert counter == {"step": 3}
    for name, p in model.named_parameters():
        assert torch.equal(p, reference[f"save/param/{name}"]), name
        assert torch.equal(opt.state[p]["exp_avg_sq"], reference[f"save/exp_avg_sq/{name}"])
    assert torch.rand(3).tolist() == reports(out, "save", 2)[0]["draw"]  # rank 0's RNG
    state = sk.read(run)
    assert state["model"]["0.weight"].shape == (16, 8)
    assert cli.main(["verify", str(run)], standalone_mode=False) in (None, 0)


def test_damaged_chunk_is_refused_before_anything_loads(
    saved: tuple[Path, Path], tmp_path: Path
) -> None:
    run, _ = saved
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    chunk = copy / "step_000000003" / "chunks-00001.safetensors"
    data = bytearray(chunk.read_bytes())
    data[-3] ^= 0x10
    chunk.write_bytes(bytes(data))
    model = plain_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(sk.CorruptCheckpointError, match="chunks-00001"):
        sk.load(copy, {"model": model}, strict=sk.Strict.ALLOW_UNEXPECTED)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


@pytest.mark.parametrize("scenario", ["killed", "killed_async"])
def test_killed_rank_commits_nothing(tmp_path: Path, scenario: str) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    codes = launch(scenario, 2, run, out)
    assert codes == [0, -signal.SIGKILL]
    outcome = json.loads((out / f"{scenario}-0.json").read_text())["outcome"]
    assert outcome != "saved"
    assert "RankFailure" in outcome and "not committed" in outcome
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["step_000000001"]
    assert [i.step for i in sk.list_checkpoints(run)] == [1]
    model = plain_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    info = sk.load(run, {"model": model, "optim": opt, "rng": sk.RNGState(), "progress": {}})
    assert info.step == 1


def test_ddp_replicated_state_is_stored_once(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert launch("ddp", 2, run, out) == [0, 0]
    step = run / "step_000000001"
    chunk_bytes = sum(p.stat().st_size for p in step.glob("chunks-*.safetensors"))
    one_copy = 2 * (64 * 64 + 64) * 4  # weights + bias, and SGD momentum of each
    assert one_copy <= chunk_bytes < one_copy * 1.1  # plus headers, not twice the state
    state = sk.read(run)
    assert set(state["model"]) == {"weight", "bias"}  # DDP's "module." prefix removed
    assert torch.equal(state["stats"]["rank"], torch.tensor([0.0]))  # replicated: rank 0's
    for report in reports(out, "ddp", 2):
        assert report["fresh_after_save"] == 0  # saving did not step a fresh optimizer
        assert report["fresh_after_load"] == 0  # and loading its checkpoint restores that


def test_failures_on_one_rank_are_seen_alike_by_all(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert launch("faults", 2, run, out) == [0, 0]
    rank0, rank1 = reports(out, "faults", 2)
    assert (rank0["attach"], rank1["attach"]) == ("RankFailure", "StorageError")
    assert rank0["steps_after_attach"] == [1, 2]  # nothing committed for step 3
    assert rank0["policy"] == rank1["policy"] == 4  # rank 0's clock decided for both
    assert (rank0["mismatch"], rank1["mismatch"]) == ("RankFailure", "KeyMismatchError")
    assert rank0["fallback"] == rank1["fallback"] == 2  # damaged step 4 skipped by both


def test_scope_distributed_needs_a_process_group(tmp_path: Path) -> None:
    with pytest.raises(sk.errors.InvalidArgumentError, match="init_process_group"):
        sk.save(tmp_path, {"x": 1}, step=1, scope=sk.Scope.DISTRIBUTED)
    with pytest.raises(sk.errors.InvalidArgumentError, match="Scope"):
        sk.save(tmp_path, {"x": 1}, step=1, scope="distributed")
    info = sk.save(tmp_path, {"x": 1}, step=1, scope=sk.Scope.LOCAL)
    assert info.step == 1


def test_per_rank_wraps_stateful_objects_only() -> None:
    with pytest.raises(sk.errors.InvalidArgumentError, match="PerRank"):
        sk.distributed.PerRank(3)
    sampler = sk.data.ResumableSampler(range(10), seed=1)
    wrapped = sk.distributed.PerRank(sampler)
    assert wrapped.state_dict() == sampler.state_dict()


@pytest.mark.parametrize("background", [False, True])
def test_assert_resumes_exactly_across_processes(background: bool) -> None:
    from tests.helpers.dist_runs import fsdp_run, fsdp_run_async

    from statekeeper.testing import assert_resumes_exactly

    run = fsdp_run_async if background else fsdp_run
    assert_resumes_exactly(run, steps=4, stop_at=2, world_size=2)


def test_world_1_dtensor_model_saves_and_resumes(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert launch("save", 1, run, out) == [0]
    manifest = json.loads((run / "step_000000003" / "manifest.json").read_text())
    assert manifest["version"] == 2  # the distributed (sharded) format, from one rank
    assert launch("resume", 1, run, out) == [0]
    reference = load_file(str(out / "reference.safetensors"))
    for key, value in load_file(str(out / "resume1.safetensors")).items():
        assert torch.equal(value, reference[key]), key


def test_background_saves_of_a_job_write_a_snapshot_and_load_exactly(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert launch("async_saves", 2, run, out) == [0, 0]
    staged = load_file(str(out / "async.safetensors"))
    loaded = load_file(str(out / "async-l.safetensors"))
    assert staged and len(staged) == len(loaded)
    for key, value in staged.items():
        assert torch.equal(loaded[key.replace("staged/", "loaded/")], value), key
    for r in reports(out, "async", 2):
        assert r["steps"] == [1, 2] and r["info"] == 2 and r["counter"] == 2
        assert r["pending_type"] == "PendingSave"


def test_a_background_failure_on_one_rank_surfaces_on_every_rank(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert launch("async_failure", 2, run, out) == [0, 0]
    first, second = reports(out, "async_failure", 2)
    assert first["errors"] == ["RankFailure"]  # rank 0: another rank failed
    assert second["errors"] == ["OSError"]  # rank 1: its own error (the injected one)
    assert first["steps"] == second["steps"] == [1, 3]  # step 2 never committed


def test_background_saves_refused_before_writing_surface_on_every_rank(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert launch("async_refused", 2, run, out) == [0, 0]
    first, second = reports(out, "async_refused", 2)
    # step 2: rank 1's capture fails; step 1 again: rank 0 finds it committed. Each rank
    # raises its own error, or a RankFailure naming another's, at the same call: wait()
    assert first["at_call"] == second["at_call"] == []
    assert first["at_wait"] == ["RankFailure", "StepExistsError"]
    assert second["at_wait"] == ["UnicodeError", "RankFailure"]
    assert first["steps"] == second["steps"] == [1, 3]


def test_a_loop_without_wait_keeps_the_ranks_saves_in_step(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert launch("async_no_wait", 2, run, out) == [0, 0]
    first, second = reports(out, "async_no_wait", 2)
    assert first["errors"] == [[3, "RankFailure"]]  # step 2's failure, at the next save
    assert second["errors"] == [[3, "UnicodeError"]]
    assert first["steps"] == second["steps"] == [1, 4, 5]
    for r in (first, second):  # every rank's state of the step itself, never a neighbour's
        assert r["found"] == {"1": 1, "4": 4, "5": 5}


def test_two_background_writers_and_a_failure_after_the_commit_on_one_rank(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert launch("async_writers", 2, run, out) == [0, 0]
    first, second = reports(out, "async_writers", 2)
    assert first["errors"] == ["OSError"] and second["errors"] == ["RankFailure"]
    assert first["steps"] == second["steps"]
    assert first["steps"]["b"] == [1, 2, 3]
    assert first["steps"]["a"] == [4]  # KeepLatest(1) after step 4 (its retention worked)
