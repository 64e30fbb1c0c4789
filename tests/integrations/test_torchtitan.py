"""torchtitan's checkpoint-manager contract, backed by statekeeper: a run of torchtitan's
own components, killed and resumed through ``load()``, ends bitwise identical to one that
never stopped (synchronous and background saves); the Config's options do what
torchtitan's own manager does with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests.helpers.framework_runs import run_to_end

import statekeeper as sk


def _run(where: Path, out: Path, every: int, kill: int, *more: str) -> int:
    return run_to_end("torchtitan_run", where, out, every, kill, *more)


@pytest.mark.parametrize(
    ("every", "kill", "mode", "kept"),
    [
        (3, 13, "sync", [9, 12]),  # resumed mid-epoch 1
        (4, 17, "sync", [12, 16]),  # resumed at epoch 1's end
        (3, 13, "async", None),  # the save of 12 may still be in flight: 9 or 12 newest
    ],
)
def test_a_killed_torchtitan_run_resumes_bitwise(
    tmp_path: Path, every: int, kill: int, mode: str, kept: list[int] | None
) -> None:
    assert _run(tmp_path / "straight", tmp_path / "straight.st", every, 0, mode) == 0
    dump = tmp_path / "killed"
    assert _run(dump, tmp_path / "unused.st", every, kill, mode) == -9
    run = dump / "checkpoint"
    steps = [i.step for i in sk.list_checkpoints(run)]
    if kept is None:  # a background save: the kill may come before its commit (6, 9),
        # after it and before its retention removed step 6 (6, 9, 12: an extra step, kept
        # safely until the next save's retention), or after both (9, 12)
        assert steps in ([6, 9], [6, 9, 12], [9, 12])
        kept = steps
    assert steps == kept  # keep_latest_k=2 (3 in the window above)
    assert sk.audit.verify(run).ok
    saved = sk.read(run)
    assert sorted(saved) == [
        "dataloader", "lr_scheduler", "model", "optimizer", "rng", "train_state"
    ]  # fmt: skip
    assert "state.0.weight.exp_avg" in saved["optimizer"]  # torchtitan's names
    assert not isinstance(saved["dataloader"], bytes | dict) or all(
        not isinstance(v, bytes) for v in saved["dataloader"].values()
    )  # torchdata's plain state, not torchtitan's pickled bytes
    assert _run(dump, tmp_path / "resumed.st", every, 0, mode) == 0
    a = load_file(str(tmp_path / "straight.st"))
    b = load_file(str(tmp_path / "resumed.st"))
    assert b["steps"].tolist() == list(range(kept[-1] + 1, 21))
    assert torch.equal(a["losses"][kept[-1] :], b["losses"])
    for key in a.keys() - {"losses", "steps"}:
        assert torch.equal(a[key], b[key]), key


def _build(dump: Path, **config: Any) -> tuple[Any, ...]:
    from tests.helpers.torchtitan_run import build

    return build(str(dump), config.pop("interval", 2), "", **config)


def _train(parts: tuple[Any, ...], steps: int) -> None:
    model, optimizers, schedulers, loader, state, manager = parts
    for x, y in loader:
        state.step += 1
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        manager.save(state.step, last_step=state.step == steps)
        if state.step == steps:
            break


def test_load_step_exclusions_and_a_fresh_start(tmp_path: Path) -> None:
    first = _build(tmp_path, last_save_model_only=False)
    assert first[-1].load(step=-1) is False  # nothing saved yet: a fresh start
    _train(first, 6)
    first[-1].close()
    assert [i.step for i in sk.list_checkpoints(tmp_path / "checkpoint")] == [4, 6]
    again = _build(tmp_path, exclude_from_loading=["dataloader"])
    loader_before = again[3].state_dict()
    assert again[-1].load(step=4) is True
    assert again[4].step == 4  # train_state
    assert again[3].state_dict() == loader_before  # excluded: left as it was
    with pytest.raises(FileNotFoundError, match="load_step=5"):
        again[-1].load(step=5)
    again[-1].close()
    with pytest.raises(sk.errors.InvalidArgumentError, match="'nothing'"):
        _build(tmp_path, exclude_from_loading=["nothing"])[-1].load()
    with pytest.raises(sk.errors.InvalidArgumentError, match="async_mode"):
        _build(tmp_path, async_mode="sometimes")


class _Adapter:
    """A state dict adapter as torchtitan models have: native names to Hugging Face's."""

    hf_assets_path = None

    def to_hf(self, state: dict[str, Any]) -> dict[str, Any]:
        return {f"hf.{k}": v for k, v in state.items()}

    def from_hf(self, state: dict[str, Any]) -> dict[str, Any]:
        return {k.removeprefix("hf."): v for k, v in state.items()}


def test_seed_and_last_saves_hold_the_model_alone(tmp_path: Path) -> None:
    from tests.helpers.torchtitan_run import build

    seed = _build(tmp_path / "seed")
    seed[-1].save(curr_step=0, last_step=True)  # torchtitan's --create_seed_checkpoint
    assert sorted(sk.read(tmp_path / "seed" / "checkpoint")) == ["model", "rng"]
    seed[-1].close()
    parts = build(
        str(tmp_path / "run"), 2, "", initial_load_path=str(tmp_path / "seed" / "checkpoint")
    )
    assert parts[-1].load() is True  # the seed, model only, from initial_load_path
    _train(parts, 4)  # the last save: model only (torchtitan's default), in float32
    parts[-1].close()
    last = sk.read(tmp_path / "run" / "checkpoint", step=4)
    assert sorted(last) == ["model", "rng"]
    # and in Hugging Face format through the model's adapter, read back the same way
    hf = build(str(tmp_path / "hf"), 2, "", _Adapter(), last_save_in_hf=True)
    _train(hf, 4)
    hf[-1].close()
    folder = tmp_path / "hf" / "checkpoint" / "hf-step-4"
    weights = load_file(str(folder / "model.safetensors"))
    assert sorted(weights) == sorted(f"hf.{k}" for k in hf[0].state_dict())
    fresh = build(
        str(tmp_path / "fresh"), 2, "", _Adapter(),
        initial_load_path=str(folder), initial_load_in_hf=True,
    )  # fmt: skip
    assert fresh[-1].load() is True
    for key, value in hf[0].state_dict().items():
        assert torch.equal(fresh[0].state_dict()[key], value), key
    fresh[-1].close()


def test_load_only_never_saves(tmp_path: Path) -> None:
    parts = _build(tmp_path, load_only=True)
    _train(parts, 4)
    assert not (tmp_path / "checkpoint").exists()
    parts[-1].close()


def test_a_rolled_back_run_replaces_the_steps_it_saves_again(tmp_path: Path) -> None:
    first = _build(tmp_path, keep_latest_k=0, last_save_model_only=False)
    _train(first, 8)
    first[-1].close()
    before = sk.read(tmp_path / "checkpoint", step=6)["train_state"]
    again = _build(tmp_path, keep_latest_k=0, last_save_model_only=False)
    assert again[-1].load(step=4) is True and again[4].step == 4
    _train(again, 8)  # saves 6 and 8 again: they replace the old ones
    again[-1].close()
    assert [i.step for i in sk.list_checkpoints(tmp_path / "checkpoint")] == [2, 4, 6, 8]
    assert sk.read(tmp_path / "checkpoint", step=6)["train_state"] == before
    assert sk.audit.verify(tmp_path / "checkpoint").ok


def test_model_only_steps_load_the_model_alone_or_say_why_not(tmp_path: Path) -> None:
    seed = _build(tmp_path, keep_latest_k=0)
    seed[-1].save(curr_step=0, last_step=True)
    _train(seed, 4)  # 2 full, 4 the last save: the model alone
    seed[-1].close()
    again = _build(tmp_path, keep_latest_k=0)
    with pytest.raises(sk.errors.InvalidArgumentError, match=r"load_step=2"):
        again[-1].load(step=-1)  # training on from a model-only last step: refused, with the fix
    again[0].apply(lambda m: torch.nn.init.zeros_(m.weight) if hasattr(m, "weight") else None)
    assert again[-1].load(step=0) is True and again[4].step == 0  # the seed: model alone
    seeded = sk.read(tmp_path / "checkpoint", step=0)["model"]
    assert all(torch.equal(again[0].state_dict()[k], v) for k, v in seeded.items())
    assert again[-1].load(step=2) is True and again[4].step == 2
    again[-1].close()


def test_what_cannot_be_saved_faithfully_is_refused(tmp_path: Path) -> None:
    from tests.helpers.torchtitan_run import build

    from statekeeper.integrations.titan_loader import DataParallelLoader

    with pytest.raises(sk.errors.InvalidArgumentError, match="quantized"):
        build(str(tmp_path), 2, "", initial_load_path=str(tmp_path),
              initial_load_in_hf=True, initial_load_in_hf_quantized=True)  # fmt: skip
    parts = _build(tmp_path)
    model, optimizers, schedulers, loader, _, manager = parts
    manager.close()
    from statekeeper.integrations.torchtitan import StatekeeperCheckpointManager

    with pytest.raises(sk.errors.InvalidArgumentError, match="pipeline"):
        StatekeeperCheckpointManager.Config(enable=True).build(
            dataloader=None, model_parts=[model, torch.nn.Linear(2, 2)], optimizers=optimizers,
            lr_schedulers=schedulers, states={}, sd_adapter=None, base_folder=str(tmp_path),
        )  # fmt: skip
    saved = DataParallelLoader(loader).state_dict()
    loader.dp_rank, loader.dp_world_size = 1, 2  # resumed with another data-parallel layout
    with pytest.raises(
        sk.errors.InvalidArgumentError, match="rank 0 of 1 and is loaded by rank 1 of 2"
    ):
        DataParallelLoader(loader).load_state_dict(saved)
    with pytest.raises(sk.errors.InvalidArgumentError, match="closed"):
        manager.save(curr_step=2)


def test_the_torchtitan_example_of_the_docs_resumes_bitwise_after_a_kill(tmp_path: Path) -> None:
    """The user-level torchtitan example of docs/integrations.md, run to its end; run
    again, SIGKILLed right after its step 10 (mid-epoch) is committed, then run once more:
    the same final weights."""
    from tests.helpers.doc_examples import run_killed_and_resumed

    run_killed_and_resumed(tmp_path, "torchtitan", 10)
