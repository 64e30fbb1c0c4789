"""Lightning saving through statekeeper: a run killed mid-way and resumed through
``trainer.fit(..., ckpt_path="last")`` ends bitwise identical to one that never stopped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file
from tests.helpers.framework_runs import oldest, run_to_end
from tests.helpers.launcher import ROOT
from tests.helpers.lightning_pkg import fabric

import statekeeper as sk


def _run(
    where: Path, out: Path, every: int, kill: int, *more: str, env: dict[str, str] | None = None
) -> int:
    return run_to_end("lightning_run", where, out, every, kill, *more, env=env)


@pytest.mark.parametrize(("every", "kill", "last"), [(3, 13, 12), (4, 17, 16)])
def test_a_killed_lightning_run_resumes_bitwise(
    tmp_path: Path, lightning: ModuleType, every: int, kill: int, last: int
) -> None:
    """Under either Lightning package (pytorch_lightning, lightning.pytorch: the helper
    checks the other is never imported)."""
    assert _run(tmp_path / "straight", tmp_path / "straight.st", every, 0) == 0
    where = tmp_path / "killed"
    assert _run(where, tmp_path / "unused.st", every, kill) == -9
    assert [i.step for i in sk.list_checkpoints(where / "last.ckpt")] == [last]
    assert sk.audit.verify(where / "last.ckpt").ok  # each checkpoint is a statekeeper run
    got = sk.read(where / "last.ckpt")
    assert "optimizer_states" not in got  # without the callback: Lightning refuses, loudly
    saved = got["statekeeper_optimizer_states"][0]["state"]
    assert sorted(saved) == [f"model/net.{i}.{k}" for i in (0, 2) for k in ("bias", "weight")]
    assert _run(where, tmp_path / "resumed.st", every, 0, "resume") == 0
    a = load_file(str(tmp_path / "straight.st"))
    b = load_file(str(tmp_path / "resumed.st"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_lightnings_async_checkpoint_io_saves_through_the_plugin(
    tmp_path: Path, lightning: ModuleType
) -> None:
    """Lightning's AsyncCheckpointIO wrapping the plugin: each save runs on its thread on
    a copy of the tensors, and the resume is exact (a kill in the middle of a save is the
    plugin's own commit protocol, tested with the core's kill tests)."""
    assert _run(tmp_path / "straight", tmp_path / "straight.st", 3, 0, "-", "async") == 0
    where = tmp_path / "killed"
    assert _run(where, tmp_path / "unused.st", 3, 13, "-", "async") == -9
    steps = [i.step for i in sk.list_checkpoints(where / "last.ckpt")]
    assert steps == [12] and sk.audit.verify(where / "last.ckpt").ok  # written on the thread
    assert _run(where, tmp_path / "resumed.st", 3, 0, "resume", "async") == 0
    a = load_file(str(tmp_path / "straight.st"))
    b = load_file(str(tmp_path / "resumed.st"))
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_hyper_parameters_are_stored_plain_or_refused_by_name(
    tmp_path: Path, lightning: ModuleType
) -> None:
    from statekeeper.integrations.lightning import StatekeeperCheckpointIO

    AttributeDict = lightning.utilities.parsing.AttributeDict
    io = StatekeeperCheckpointIO()
    assert isinstance(io, fabric(lightning.__name__).plugins.CheckpointIO)  # this package's
    checkpoint = {"global_step": 3, "hyper_parameters": AttributeDict(lr=0.1, layers=[2, 3])}
    io.save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    got = io.load_checkpoint(tmp_path / "a.ckpt")
    assert got["hyper_parameters"] == {"lr": 0.1, "layers": [2, 3]} and got["global_step"] == 3
    io.save_checkpoint({"global_step": 4}, tmp_path / "a.ckpt")  # the same name again
    assert [i.step for i in sk.list_checkpoints(tmp_path / "a.ckpt")] == [4]
    with pytest.raises(sk.errors.UnsupportedValueError, match="hyper_parameters/fn"):
        io.save_checkpoint({"global_step": 1, "hyper_parameters": {"fn": len}}, tmp_path / "b")
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()


class SingleDeviceStrategy:  # the name the callback checks: a plain single-device run
    pass


def test_optimizer_state_is_keyed_by_name_whatever_order_parameters_come_in() -> None:
    from types import SimpleNamespace

    from pytorch_lightning.trainer.states import TrainerFn

    from statekeeper.integrations.lightning import StatekeeperCallback

    def module(first: str) -> torch.nn.Module:
        m = torch.nn.Module()
        for name in (first, "b" if first == "a" else "a"):  # registration order varies
            setattr(m, name, torch.nn.Parameter(torch.full((2,), 1.0 if name == "a" else 2.0)))
        return m

    saving = module("a")
    opt = torch.optim.Adam(saving.parameters())
    (saving.a.sum() + 10 * saving.b.sum()).backward()
    opt.step()
    callback = StatekeeperCallback()
    fitting = SimpleNamespace(fn=TrainerFn.FITTING)
    trainer = SimpleNamespace(optimizers=[opt], strategy=SingleDeviceStrategy(), state=fitting)
    checkpoint = {"optimizer_states": [opt.state_dict()]}
    callback.on_save_checkpoint(trainer, saving, checkpoint)
    loading = module("b")  # the same names, the other order: positions swap
    fresh = torch.optim.Adam(loading.parameters())
    callback.on_load_checkpoint(trainer, loading, checkpoint)
    resumed = SimpleNamespace(optimizers=[fresh], strategy=trainer.strategy, state=fitting)
    callback.on_fit_start(resumed, loading)
    fresh.load_state_dict(checkpoint["optimizer_states"][0])
    assert torch.equal(fresh.state[loading.a]["exp_avg"], opt.state[saving.a]["exp_avg"])
    assert torch.equal(fresh.state[loading.b]["exp_avg"], opt.state[saving.b]["exp_avg"])


@pytest.mark.xdist_group("gloo")
def test_a_ddp_run_saves_from_rank_zero_alone(tmp_path: Path, lightning: ModuleType) -> None:
    # Lightning calls the plugin on rank 0 only: a collective save there would wait forever
    args = [sys.executable, "-m", "tests.helpers.lightning_ddp", str(tmp_path / "ckpt")]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done 0" in done.stdout and "done 1" in done.stdout
    last = tmp_path / "ckpt" / "last.ckpt"
    assert [i.step for i in sk.list_checkpoints(last)] == [4] and sk.audit.verify(last).ok
    assert "statekeeper_optimizer_states" in sk.read(last)


def _ddp(where: Path, *more: str) -> str:
    args = [sys.executable, "-m", "tests.helpers.lightning_ddp", str(where), *more]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.xdist_group("gloo")
def test_a_one_process_checkpoint_resumed_by_two_gloo_ranks_says_what_they_share(
    tmp_path: Path, lightning: ModuleType
) -> None:
    """A legitimate scale-up (saved by 1 process, resumed under DDP by 2): not refused, and
    never silent: rank 0 warns (SharedRankStateWarning) that every rank resumes the one
    process's RNG and loader state, with the fix. Saved and resumed by 2: no such warning."""
    _ddp(tmp_path / "one", "1", "4")
    assert [i.step for i in sk.list_checkpoints(tmp_path / "one" / "last.ckpt")] == [4]
    out = _ddp(tmp_path / "one", "2", "8", "resume")
    assert "done 0" in out and "done 1" in out
    assert out.count("warned SharedRankStateWarning:") == 1, out  # rank 0's (lines interleave)
    warned = out[out.index("warned SharedRankStateWarning:") :]
    assert "saved by 1 process and is resumed by 2" in warned
    assert "RNG state" in warned and "reseed per rank" in warned
    _ddp(tmp_path / "two", "2", "4")
    out = _ddp(tmp_path / "two", "2", "8", "resume")  # each rank's own: nothing shared
    assert "done 0" in out and "warned Shared" not in out


@pytest.mark.parametrize(("every", "kill"), [(3, 13), (4, 17)])  # mid-epoch; at its end
def test_a_killed_fabric_run_resumes_bitwise_by_parameter_name(
    tmp_path: Path, lightning: ModuleType, every: int, kill: int
) -> None:
    """Fabric's fabric.save / fabric.load through the plugin, the optimizer by name: the
    resumed model registers its parameters in the other order and still ends identical."""
    run = lambda *a: run_to_end("fabric_run", *a)  # noqa: E731
    assert run(tmp_path / "straight", tmp_path / "straight.st", every, 0) == 0
    where = tmp_path / "killed"
    assert run(where, tmp_path / "unused.st", every, kill) == -9
    saved = sk.read(where / "last")
    assert sorted(saved["optimizer"]["state"]) == [
        f"model/{m}.{k}" for m in ("first", "second") for k in ("bias", "weight")
    ]
    assert run(where, tmp_path / "resumed.st", every, 0, "resume", "reversed") == 0
    a = load_file(str(tmp_path / "straight.st"))
    b = load_file(str(tmp_path / "resumed.st"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_the_oldest_supported_lightning_resumes_bitwise(tmp_path: Path) -> None:
    """The extra's floor (pytorch-lightning>=2.6) is tested, not just declared: scripts/setup
    installs 2.6.0 apart, and the same kill-and-resume runs on it."""
    version, env = oldest("lightning", "pytorch-lightning")
    where, probe = tmp_path / "killed", tmp_path / "version.txt"
    assert _run(tmp_path / "straight", tmp_path / "straight.st", 3, 0, env=env) == 0
    assert _run(where, tmp_path / "unused.st", 3, 13, env=env) == -9
    assert _run(where, tmp_path / "resumed.st", 3, 0, "resume", "-", str(probe), env=env) == 0
    assert probe.read_text() == version
    a = load_file(str(tmp_path / "straight.st"))
    b = load_file(str(tmp_path / "resumed.st"))
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _fsdp_job(where: Path, out: Path, every: int, kill: int, *more: str) -> int:
    args = [sys.executable, "-m", "tests.helpers.lightning_fsdp_run", str(where), str(out)]
    done = subprocess.run(
        [*args, str(every), str(kill), *more],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode in (0, -9), done.stderr[-3000:]
    return done.returncode


@pytest.fixture(scope="module")
def fsdp_straight() -> dict[str, Path]:
    """One uninterrupted FSDP2 run (saving every 3 steps), the reference of every kill: a
    resumed run that saved at other steps must end the same, as saving never changes
    training."""
    return {}  # per Lightning package: its straight run, made once


def _straight(made: dict[str, Path], root: Path, package: str) -> Path:
    if package not in made:
        where = root / f"fsdp_straight_{package}"
        assert _fsdp_job(where / "run", where / "straight.st", 3, 0) == 0
        made[package] = where / "straight.st"
    return made[package]


@pytest.mark.xdist_group("gloo")
@pytest.mark.parametrize(("every", "kill"), [(3, 7), (4, 9)])  # mid-epoch; at its end
def test_a_killed_fsdp2_run_resumes_bitwise(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    fsdp_straight: dict[str, Path],
    lightning: ModuleType,
    every: int,
    kill: int,
) -> None:
    """Lightning's FSDP2 strategy bypasses CheckpointIO: StatekeeperModelParallelStrategy
    saves each rank's shards as one statekeeper step; killed and resumed with
    ckpt_path="last", two gloo ranks end bitwise identical."""

    def job(where: Path, out: Path, kill: int, *more: str) -> int:
        return _fsdp_job(where, out, every, kill, *more)

    where = tmp_path / "killed"
    assert job(where, tmp_path / "unused.st", kill) == -9
    last = where / "last.ckpt"
    assert [i.step for i in sk.list_checkpoints(last)] == [kill - 1] and sk.audit.verify(last).ok
    saved = sk.read(last)
    assert sorted(saved) == ["lightning", "model", "optimizer_0", "statekeeper_rng"]
    assert sorted(saved["optimizer_0"]["state"])[0] == "model/net.0.bias"  # by name
    assert job(where, tmp_path / "resumed.st", 0, "resume") == 0
    straight = _straight(fsdp_straight, tmp_path_factory.getbasetemp(), lightning.__name__)
    a = load_file(str(straight))
    b = load_file(str(tmp_path / "resumed.st"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _batches(log: Path, rank: int) -> dict[int, tuple[list[int], float]]:
    """Step -> the sample ids it trained on and its random draw (the last run's, where a
    resume ran it again)."""
    seen: dict[int, tuple[list[int], float]] = {}
    for line in (log.parent / f"{log.name}.{rank}").read_text().splitlines():
        step, ids, draw = json.loads(line)
        seen[step] = (ids, draw)
    return seen


@pytest.mark.xdist_group("gloo")
def test_a_ddp_run_resumed_mid_epoch_trains_on_the_same_samples(
    tmp_path: Path, lightning: ModuleType
) -> None:
    """Lightning makes the resumed iterator before it sets its DistributedSampler's epoch
    (Lightning issue #21938): without StatekeeperCallback's repair, the rest of epoch 1
    is drawn from epoch 0's permutation. Killed after step 7 (newest step: 6, mid-epoch 1)
    and resumed, both ranks train every step on the samples of the run that never stopped
    (loaded by two workers each), with the same random draws."""

    def job(where: Path, log: Path, kill: int, *more: str) -> int:
        args = [sys.executable, "-m", "tests.helpers.lightning_order_run", str(where), str(log)]
        done = subprocess.run(
            [*args, str(kill), *more], cwd=ROOT, capture_output=True, text=True, timeout=600
        )
        assert done.returncode in (0, -9), done.stderr[-3000:]
        return done.returncode

    assert job(tmp_path / "straight", tmp_path / "straight", 0) == 0
    assert job(tmp_path / "killed", tmp_path / "resumed", 7) == -9
    assert job(tmp_path / "killed", tmp_path / "resumed", 0, "resume") == 0
    for rank in (0, 1):
        straight, resumed = (
            _batches(tmp_path / "straight", rank),
            _batches(tmp_path / "resumed", rank),
        )
        assert sorted(straight) == list(range(10)) and resumed == straight, rank
        assert straight[6][0] != straight[2][0]  # epochs 0 and 1 are drawn in other orders


def test_the_fabric_example_of_the_docs_resumes_bitwise_after_a_kill(tmp_path: Path) -> None:
    """The user-level Fabric example of docs/integrations.md (two workers augmenting with
    torch's, numpy's and Python's RNGs), run to its end; run again, SIGKILLed right after
    its step 10 (mid-epoch) is committed, then run once more: the same final weights."""
    from tests.helpers.doc_examples import run_killed_and_resumed

    run_killed_and_resumed(tmp_path, "fabric", 10)
