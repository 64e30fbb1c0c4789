"""Offline averaging of checkpoints: exact float64 means, newest-wins integers, tying kept."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import statekeeper as sk
from statekeeper.averaging.offline import average_checkpoints, normalize_weights
from statekeeper.format.manifest import Manifest


class Net(torch.nn.Module):
    """Tied embedding/head, a BatchNorm (int64 num_batches_tracked) and a plain layer."""

    def __init__(self, out: int = 6, extra: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(out, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.proj = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, out, bias=False)
        self.head.weight = self.embed.weight
        if extra:
            self.more = torch.nn.Linear(4, 2)


def _state(seed: int, **kw: Any) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = Net(**kw)
    with torch.no_grad():
        model.bn.running_mean.uniform_()
        model.bn.num_batches_tracked.fill_(100 + seed)
    return {
        "model": model,
        "half": torch.randn(3, 5).to(torch.bfloat16),
        "mask": torch.arange(4) % (seed + 2) == 0,
        "arr": np.arange(4, dtype=np.float32) * (seed + 1),
        "epoch": seed,
        "config": {"name": f"run{seed}", "lr": 0.1 * seed},
    }


def _runs(tmp_path: Path, steps: tuple[int, ...] = (10, 20, 30), **kw: Any) -> list[Path]:
    runs = []
    for seed, step in enumerate(steps):
        run = tmp_path / f"in{seed}"
        sk.save(run, _state(seed, **kw), step=step)
        runs.append(run)
    return runs


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    flat = {f"model/{k}": v for k, v in state["model"].items()}
    flat.update(half=state["half"], mask=state["mask"], arr=torch.from_numpy(state["arr"]))
    return flat


def _manifest(step_dir: str) -> Manifest:
    path = Path(step_dir) / "manifest.json"
    return Manifest.from_bytes(str(path), path.read_bytes())


def test_uniform_mean_is_the_float64_mean_in_the_original_dtype(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    inputs = [_tensors(sk.read(run)) for run in runs]
    info = average_checkpoints(runs, tmp_path / "out")
    assert info.step == 30
    out = sk.read(tmp_path / "out")
    got = _tensors(out)
    assert got.keys() == inputs[0].keys()
    for name, t in got.items():
        a, b, c = (inp[name] for inp in inputs)
        assert t.dtype == a.dtype and t.shape == a.shape, name
        if t.is_floating_point():
            expected = ((a.double() + b.double() + c.double()) / 3).to(a.dtype)
            assert torch.equal(t, expected), name
        else:  # integers and bools: the newest input's
            assert torch.equal(t, c), name
    assert out["half"].dtype == torch.bfloat16
    assert out["model"]["bn.num_batches_tracked"].item() == 102
    assert isinstance(out["arr"], np.ndarray)
    assert out["epoch"] == 2 and out["config"] == {"name": "run2", "lr": 0.1 * 2}


def test_tied_weights_stay_tied(tmp_path: Path) -> None:
    info = average_checkpoints(_runs(tmp_path), tmp_path / "out")
    model = sk.read(tmp_path / "out")["model"]
    assert model["head.weight"].data_ptr() == model["embed.weight"].data_ptr()
    manifest = _manifest(info.path)
    assert manifest.aliases["model/head.weight"].base == "model/embed.weight"
    assert "model/head.weight" not in manifest.tensors


def test_weighted_mean(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    inputs = [_tensors(sk.read(run)) for run in runs]
    average_checkpoints(runs, tmp_path / "out", weights=[1, 2, 5])
    got = _tensors(sk.read(tmp_path / "out"))
    for name, t in got.items():
        a, b, c = (inp[name] for inp in inputs)
        if t.is_floating_point():
            expected = (a.double() * 1.0 + b.double() * 2.0 + c.double() * 5.0) / 8.0
            assert torch.equal(t, expected.to(a.dtype)), name
    assert normalize_weights([1, 2, 5], 3) == [0.125, 0.25, 0.625]
    assert normalize_weights(None, 4) == [0.25] * 4


def test_zero_weights_select_one_input(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    average_checkpoints(runs, tmp_path / "out", weights=[0.0, 1.0, 0.0])
    got, middle = _tensors(sk.read(tmp_path / "out")), _tensors(sk.read(runs[1]))
    for name, t in got.items():
        if t.is_floating_point():
            assert torch.equal(t, middle[name]), name


def test_newest_is_the_highest_step_then_the_last_path(tmp_path: Path) -> None:
    runs = _runs(tmp_path, steps=(30, 10, 20))
    info = average_checkpoints(runs, tmp_path / "out")
    out = sk.read(tmp_path / "out")
    assert info.step == 30 and out["epoch"] == 0
    assert out["model"]["bn.num_batches_tracked"].item() == 100
    tied = _runs(tmp_path / "tie", steps=(5, 5, 5))
    average_checkpoints([tied[2], tied[0], tied[1]], tmp_path / "out2")
    assert sk.read(tmp_path / "out2")["epoch"] == 1


def test_key_averages_one_entry_and_saves_only_it(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    steps = [run / "step_000000010" for run in runs[:1]] + runs[1:]  # a step dir works too
    info = average_checkpoints(steps, tmp_path / "out", key="model", out_step=7)
    out = sk.read(tmp_path / "out")
    assert info.step == 7 and list(out) == ["model"]
    full = sk.read(runs[0])["model"]
    assert list(out["model"]) == list(full)
    assert out["model"]["head.weight"].data_ptr() == out["model"]["embed.weight"].data_ptr()


def test_missing_key_is_a_mismatch(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    sk.save(tmp_path / "other", {"net": torch.zeros(2)}, step=40)
    with pytest.raises(sk.KeyMismatchError) as info:
        average_checkpoints([*runs, tmp_path / "other"], tmp_path / "out", key="model")
    assert "model: no such entry" in str(info.value) and "net" in str(info.value)
    with pytest.raises(
        sk.errors.InvalidArgumentError, match="no checkpoint holds the entry 'nope'"
    ):
        average_checkpoints(runs, tmp_path / "out", key="nope")


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"extra": True}, "model/more.weight: in "),
        ({"out": 7}, "model/embed.weight: shape (7, 4) in "),
    ],
)
def test_mismatched_names_and_shapes_are_listed(
    tmp_path: Path, kw: dict[str, Any], problem: str
) -> None:
    runs = _runs(tmp_path)
    sk.save(tmp_path / "odd", _state(5, **kw), step=1)
    with pytest.raises(sk.KeyMismatchError) as info:
        average_checkpoints([*runs, tmp_path / "odd"], tmp_path / "out")
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems
    assert not (tmp_path / "out").exists()


def test_mismatched_dtypes_are_listed(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    state = _state(5)
    state["model"].double()
    sk.save(tmp_path / "odd", state, step=1)
    with pytest.raises(sk.KeyMismatchError) as info:
        average_checkpoints([*runs, tmp_path / "odd"], tmp_path / "out")
    problems = info.value.problems
    for name in ("proj.weight", "proj.bias", "embed.weight", "head.weight", "bn.running_var"):
        assert any(p.startswith(f"model/{name}: dtype float64 in ") for p in problems), name
    assert all("num_batches_tracked" not in p for p in problems)
    assert "same tensor names, shapes, dtypes" in str(info.value)


def test_untied_input_is_a_mismatch(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    state = _state(5)
    state["model"].head.weight = torch.nn.Parameter(state["model"].embed.weight.detach().clone())
    sk.save(tmp_path / "odd", state, step=1)
    with pytest.raises(sk.KeyMismatchError, match=r"head\.weight: shares memory differently"):
        average_checkpoints([*runs, tmp_path / "odd"], tmp_path / "out")


@pytest.mark.parametrize(
    "weights",
    [[1.0, 2.0], [1.0, -1.0, 1.0], [1.0, math.nan, 1.0], [1.0, math.inf, 1.0], [0, 0, 0],
     [1.0, True, 1.0], [1.0, "2", 1.0], "123"],
)  # fmt: skip
def test_bad_weights(tmp_path: Path, weights: Any) -> None:
    runs = _runs(tmp_path)
    with pytest.raises(sk.errors.InvalidArgumentError, match="weight"):
        average_checkpoints(runs, tmp_path / "out", weights=weights)


def test_bad_arguments(tmp_path: Path) -> None:
    runs = _runs(tmp_path, steps=(1,))
    with pytest.raises(sk.errors.InvalidArgumentError, match="no paths"):
        average_checkpoints([], tmp_path / "out")
    with pytest.raises(sk.errors.InvalidArgumentError, match="list of checkpoint"):
        average_checkpoints(str(runs[0]), tmp_path / "out")
    with pytest.raises(sk.errors.InvalidArgumentError, match="key"):
        average_checkpoints(runs, tmp_path / "out", key="")
    with pytest.raises(sk.StepNotFoundError):
        average_checkpoints([tmp_path / "nothing"], tmp_path / "out")


def test_existing_output_step_is_refused(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    with pytest.raises(sk.errors.StepExistsError):
        average_checkpoints(runs, runs[2])
    info = average_checkpoints(runs, runs[2], out_step=31)  # into an input run, as a new step
    assert info.step == 31 and [i.step for i in sk.list_checkpoints(runs[2])] == [30, 31]


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_damaged_shard_is_reported_before_anything_is_written(tmp_path: Path, damage: str) -> None:
    """Shards are verified as every read verifies a step's files (catalog/verifier.py):
    the same checks, the same messages."""
    runs = _runs(tmp_path)
    (shard,) = (runs[1] / "step_000000020").glob("*.safetensors")
    data = bytearray(shard.read_bytes())
    if damage == "flipped":
        data[-1] ^= 0xFF
        problem = r"checksum mismatch \(expected xxh3_128:[0-9a-f]{32}\)"
    else:
        problem = f"size is {len(data) - 1} bytes, the manifest says {len(data)}"
        del data[-1]
    shard.write_bytes(bytes(data))
    with pytest.raises(sk.CorruptCheckpointError, match=problem) as info:
        average_checkpoints(runs, tmp_path / "out")
    assert str(shard) in str(info.value)
    assert not (tmp_path / "out").exists()


def test_streams_tensors_and_reports_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _runs(tmp_path)

    def no_whole_shards(data: bytes) -> dict[str, torch.Tensor]:
        raise AssertionError("averaging must not decode whole shards")

    calls: list[tuple[int, int]] = []
    with monkeypatch.context() as patch:
        patch.setattr("statekeeper.checkpoint.reader.parse", no_whole_shards)
        info = average_checkpoints(
            runs, tmp_path / "out", progress=lambda done, total: calls.append((done, total))
        )
    total = len(_manifest(info.path).tensors)
    assert calls == [(i, total) for i in range(total + 1)]
