"""The transformers Trainer saving through statekeeper: a run killed mid-way (between
steps, or inside a save) and resumed through ``train(resume_from_checkpoint=True)`` ends
bitwise identical to one that never stopped; every checkpoint-N is complete, pickle-free,
checksummed, loadable with ``from_pretrained`` and rotated by step number."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from safetensors.torch import load_file
from tests.helpers.framework_runs import oldest, run_to_end

import statekeeper as sk
from statekeeper.integrations import hf_layout

if TYPE_CHECKING:
    from statekeeper.integrations.transformers import StatekeeperTrainer


def _run(
    where: Path, out: Path, every: int, kill: int, *more: str, env: dict[str, str] | None = None
) -> int:
    return run_to_end("hf_trainer_run", where, out, every, kill, *more, env=env)


def _same(a_file: Path, b_file: Path) -> None:
    a, b = load_file(str(a_file)), load_file(str(b_file))
    assert b.keys() <= a.keys() and any(k.startswith("adam/") for k in a)
    assert a.keys() - b.keys() <= {k for k in a if k.startswith("input/")}  # steps before
    assert a["steps"].tolist() == list(range(1, 21))
    for key in b:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(
    ("every", "kill", "kept"),
    [(3, 13, [9, 12]), (4, 17, [12, 16])],  # resumed mid-epoch 1, then at epoch 1's end
)
def test_a_killed_trainer_run_resumes_bitwise(
    tmp_path: Path, every: int, kill: int, kept: list[int]
) -> None:
    from transformers.trainer_utils import get_last_checkpoint

    assert _run(tmp_path / "straight", tmp_path / "straight.st", every, 0) == 0
    out = tmp_path / "killed"
    assert _run(out, tmp_path / "unused.st", every, kill) == -9
    assert list(hf_layout.checkpoints(out)) == kept  # save_total_limit=2, by step number
    newest = out / f"checkpoint-{kept[-1]}"
    assert get_last_checkpoint(str(out)) == str(newest)
    names = {p.name for p in newest.iterdir()}
    assert {"config.json", "model.safetensors", "trainer_state.json"} <= names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth"))]  # nothing pickled
    assert sk.audit.verify(newest).ok
    saved = sk.read(newest)
    assert "model/bert.embeddings.word_embeddings.weight" in saved["optimizer"]["state"]
    assert sorted(saved["files"]) == sorted(n for n in names if "." in n and n[0] != ".")
    assert _run(out, tmp_path / "resumed.st", every, 0, "resume") == 0
    _same(tmp_path / "straight.st", tmp_path / "resumed.st")


@pytest.mark.parametrize(
    ("every", "kill", "mode"),
    [
        (3, 13, "augment"),  # resumed mid-epoch 1
        (4, 17, "augment"),  # at epoch 1's end
        (4, 17, "augment+persistent"),  # workers that carry their RNG over the epoch's end
    ],
)
def test_worker_augmentation_and_an_ema_resume_bitwise(
    tmp_path: Path, every: int, kill: int, mode: str
) -> None:
    """Random augmentation in two loader workers (Python's, numpy's and torch's RNGs) and an
    EMA given as extra_state: the resumed run trains on the same inputs at every step and
    its EMA ends as the straight run's. Each run starts with resume_from_checkpoint=True."""
    assert _run(tmp_path / "straight", tmp_path / "straight.st", every, 0, mode) == 0
    out = tmp_path / "killed"
    assert _run(out, tmp_path / "unused.st", every, kill, mode) == -9
    newest = max(hf_layout.checkpoints(out))
    assert (
        "ema" not in sk.read(out / f"checkpoint-{newest}")
        and sk.read(out / f"checkpoint-{newest}")["extra.ema"]
    )
    assert _run(out, tmp_path / "resumed.st", every, 0, f"resume+{mode}") == 0
    _same(tmp_path / "straight.st", tmp_path / "resumed.st")
    resumed = load_file(str(tmp_path / "resumed.st"))
    assert sorted(int(k[6:]) for k in resumed if k.startswith("input/")) == list(
        range(newest + 1, 21)
    )
    assert any(k.startswith("ema/") for k in resumed)


def test_resume_true_on_a_first_run_starts_from_scratch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    trainer = _tiny_trainer(tmp_path / "new")
    with caplog.at_level(logging.INFO, logger="statekeeper.integrations.transformers"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6
    assert "no checkpoint-N" in caplog.text and "from scratch" in caplog.text
    again = _tiny_trainer(tmp_path / "new", max_steps=8)
    again.train(True)  # positional: resumes from checkpoint-6
    assert again.state.global_step == 8
    assert list(hf_layout.checkpoints(tmp_path / "new")) == [2, 4, 6, 8]


def test_extra_state_is_checked_on_construction_and_on_resume(tmp_path: Path) -> None:
    ema = sk.averaging.AveragedModel(torch.nn.Linear(2, 2))
    with pytest.raises(sk.errors.InvalidArgumentError, match="state_dict"):
        _tiny_trainer(tmp_path, extra_state={"ema": 3})
    with pytest.raises(sk.errors.InvalidArgumentError, match="identifier"):
        _tiny_trainer(tmp_path, extra_state={"my ema": ema})
    _tiny_trainer(tmp_path, extra_state={"ema": ema}).train()
    saved = {k: v.clone() for k, v in ema.state_dict().items()}
    with torch.no_grad():
        ema.module.weight.zero_()
    resumed = _tiny_trainer(tmp_path, max_steps=6, extra_state={"ema": ema})
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert all(torch.equal(saved[k], v) for k, v in ema.state_dict().items())  # restored
    for extra, match in (({}, "saved, not given"), ({"ema": ema, "n": sk.Value(1)}, "missing")):
        with pytest.raises(sk.KeyMismatchError, match=match):
            _tiny_trainer(tmp_path, extra_state=extra).train(resume_from_checkpoint=True)


def test_a_loader_of_ones_own_with_workers_warns_at_train_start(tmp_path: Path) -> None:
    from tests.helpers.hf_trainer_run import dataset
    from torch.utils.data import DataLoader
    from transformers import default_data_collator

    trainer = _tiny_trainer(tmp_path, max_steps=2)
    plain: DataLoader[Any] = DataLoader(
        dataset(), batch_size=4, num_workers=2, collate_fn=default_data_collator
    )
    # (typing) the test's own loader in place of the Trainer's
    trainer.get_train_dataloader = lambda: plain  # type: ignore[method-assign]
    with pytest.warns(sk.StatekeeperWarning, match=r"super\(\)\.get_train_dataloader"):
        trainer.train()


def test_a_kill_inside_a_save_leaves_no_folder_a_resume_would_pick(tmp_path: Path) -> None:
    from transformers.trainer_utils import get_last_checkpoint

    assert _run(tmp_path / "straight", tmp_path / "straight.st", 3, 0) == 0
    out = tmp_path / "killed"
    assert _run(out, tmp_path / "unused.st", 3, 12, "kill-in-save") == -9
    assert (out / "checkpoint-12.partial" / "model.safetensors").is_file()
    assert get_last_checkpoint(str(out)) == str(out / "checkpoint-9")
    assert _run(out, tmp_path / "resumed.st", 3, 0, "resume") == 0
    _same(tmp_path / "straight.st", tmp_path / "resumed.st")
    assert sorted(os.listdir(out)) == ["checkpoint-18", "checkpoint-20"]  # leftover removed


def _tiny_trainer(out: Path, **overrides: object) -> StatekeeperTrainer:
    from tests.helpers.hf_trainer_run import dataset, model
    from transformers import TrainingArguments

    from statekeeper.integrations.transformers import StatekeeperTrainer

    retention = overrides.pop("retention", None)
    extra = overrides.pop("extra_state", None)
    options: dict[str, object] = {
        "output_dir": str(out),
        "max_steps": 6,
        "per_device_train_batch_size": 4,
        "save_strategy": "steps",
        "save_steps": 2,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        **overrides,
    }
    data = dataset()
    return StatekeeperTrainer(
        model=model(),
        args=TrainingArguments(**options),
        train_dataset=data,
        eval_dataset=data[:8],
        retention=retention,
        extra_state=extra,
    )


def test_from_pretrained_loads_each_checkpoint(tmp_path: Path) -> None:
    from transformers import BertForSequenceClassification

    trainer = _tiny_trainer(tmp_path)
    trainer.train()
    again = BertForSequenceClassification.from_pretrained(str(tmp_path / "checkpoint-6"))
    live = trainer.model.state_dict()
    for key, value in again.state_dict().items():
        assert torch.equal(value, live[key]), key


def test_a_damaged_file_stops_the_resume_before_the_model_changes(tmp_path: Path) -> None:
    trainer = _tiny_trainer(tmp_path)
    trainer.train()
    weights = tmp_path / "checkpoint-4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # a flipped bit in the last tensor
    weights.write_bytes(bytes(data))
    fresh = _tiny_trainer(tmp_path)
    before = {k: v.clone() for k, v in fresh.model.state_dict().items()}
    with pytest.raises(sk.CorruptCheckpointError, match=r"model\.safetensors does not match"):
        fresh.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    after = fresh.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_best_checkpoint_is_kept_and_loaded_at_the_end(tmp_path: Path) -> None:
    trainer = _tiny_trainer(
        tmp_path,
        eval_strategy="steps",
        eval_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
        greater_is_better=True,  # the worst loss wins: the best is not the newest
        save_total_limit=1,
        learning_rate=5e-3,
    )
    trainer.train()
    state = trainer.state
    best = Path(state.best_model_checkpoint)
    assert best.is_dir() and best.name != "checkpoint-6"
    assert sorted(os.listdir(tmp_path)) == [best.name]  # the Trainer's own end-of-run pruning
    weights = load_file(str(best / "model.safetensors"))
    live = trainer.model.state_dict()
    assert all(torch.equal(v, live[k]) for k, v in weights.items())


def test_a_retention_policy_replaces_save_total_limit(tmp_path: Path) -> None:
    trainer = _tiny_trainer(tmp_path, max_steps=8, retention=sk.KeepEvery(4))
    trainer.train()
    assert list(hf_layout.checkpoints(tmp_path)) == [4, 8]
    with pytest.raises(sk.errors.InvalidArgumentError, match="Retention"):
        _tiny_trainer(tmp_path, retention=3)


def test_a_checkpoint_of_the_plain_trainer_still_resumes(tmp_path: Path) -> None:
    from tests.helpers.hf_trainer_run import dataset, model
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, save_steps=2, report_to=[], use_cpu=True,
        per_device_train_batch_size=4, disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model(), args=args, train_dataset=dataset()).train()
    trainer = _tiny_trainer(tmp_path)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert trainer.state.global_step == 6
    assert sk.audit.verify(tmp_path / "checkpoint-6").ok


def test_the_oldest_supported_transformers_resumes_bitwise(tmp_path: Path) -> None:
    """The extra's floor (transformers>=5.0) is tested, not just declared: scripts/setup
    installs 5.0.0 apart, and the same kill-and-resume runs on it."""
    version, env = oldest("transformers", "transformers")
    out = tmp_path / "killed"
    probe = tmp_path / "version.txt"
    assert _run(tmp_path / "straight", tmp_path / "straight.st", 4, 0, env=env) == 0
    assert _run(out, tmp_path / "unused.st", 4, 13, env=env) == -9
    assert _run(out, tmp_path / "resumed.st", 4, 0, "resume", str(probe), env=env) == 0
    assert probe.read_text() == version
    _same(tmp_path / "straight.st", tmp_path / "resumed.st")


@pytest.mark.xdist_group("gloo")
def test_a_killed_ddp_trainer_run_resumes_bitwise(tmp_path: Path) -> None:
    """Two DDP ranks (gloo): the save is collective (each rank's RNG), rank 0 writes the
    model folder and commits; a job killed after step 13 resumes from checkpoint-12."""
    import sys

    from tests.helpers import launcher
    from tests.helpers.launcher import ROOT

    def job(where: Path, out: Path, kill: int, *more: str) -> int:
        args = [sys.executable, "-m", "tests.helpers.hf_trainer_ddp", str(where), str(out)]
        done = launcher.run(
            [*args, "3", str(kill), *more], cwd=ROOT, capture_output=True, text=True, timeout=600
        )
        assert done.returncode in (0, 9), done.stderr[-3000:]
        return done.returncode

    assert job(tmp_path / "straight", tmp_path / "straight.st", 0) == 0
    out = tmp_path / "killed"
    assert job(out, tmp_path / "unused.st", 13) == 9
    assert list(hf_layout.checkpoints(out)) == [9, 12]
    saved = sk.read(out / "checkpoint-12")
    assert sk.audit.verify(out / "checkpoint-12").ok and "optimizer" in saved
    assert job(out, tmp_path / "resumed.st", 0, "resume") == 0
    _same(tmp_path / "straight.st", tmp_path / "resumed.st")
    _same(tmp_path / "resumed.st", Path(f"{tmp_path / 'resumed.st'}.rank1"))


def test_a_folder_of_ours_that_lost_its_step_is_refused_not_resumed_bare(tmp_path: Path) -> None:
    import shutil

    trainer = _tiny_trainer(tmp_path)
    trainer.train()
    folder = tmp_path / "checkpoint-6"
    assert not (folder / ".statekeeper.lock").exists()  # nothing of the save's left behind
    shutil.rmtree(next(folder.glob("step_*")))  # as a kill in the middle of a deletion
    with pytest.raises(sk.CorruptCheckpointError, match="holds no statekeeper step"):
        _tiny_trainer(tmp_path).train(resume_from_checkpoint=True)


def test_a_rolled_back_run_sets_newer_folders_aside(tmp_path: Path) -> None:
    first = _tiny_trainer(tmp_path, max_steps=8)
    first.train()
    again = _tiny_trainer(tmp_path, max_steps=8)
    resumed = again.train
    with pytest.warns(sk.StatekeeperWarning, match=r"abandoned\.checkpoint-6\."):
        resumed(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    names = sorted(os.listdir(tmp_path))
    assert [n for n in names if n.startswith("checkpoint-") and "." not in n] == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6", "checkpoint-8"
    ]  # fmt: skip
    assert len([n for n in names if n.startswith("abandoned.")]) == 2  # 6, 8 of the first
    assert again._sk_loaded is not None and not again._sk_loaded.state


def test_save_total_limit_counts_the_best_folder(tmp_path: Path) -> None:
    trainer = _tiny_trainer(
        tmp_path, max_steps=10, eval_strategy="steps", eval_steps=2,
        metric_for_best_model="loss", greater_is_better=True, save_total_limit=2,
        learning_rate=5e-3,
    )  # fmt: skip
    trainer.train()
    best = Path(trainer.state.best_model_checkpoint)
    kept = sorted(hf_layout.checkpoints(tmp_path))
    assert len(kept) == 2 and kept[-1] == 10 and best.name in {f"checkpoint-{s}" for s in kept}


def test_the_trainers_own_end_of_run_deletions_rename_folders_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_total_limit=1 with a best folder: at the end of train() the Trainer deletes the
    other folders itself; each is renamed aside before a file of it goes."""
    import shutil

    deleted: list[str] = []
    real = shutil.rmtree

    def recording(path: object, *args: object, **kwargs: object) -> None:
        deleted.append(Path(str(path)).name)
        real(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", recording)
    trainer = _tiny_trainer(
        tmp_path, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
        metric_for_best_model="loss", greater_is_better=True, save_total_limit=1,
        learning_rate=5e-3,
    )  # fmt: skip
    trainer.train()
    assert any(".removing-" in name for name in deleted)
    assert not [
        n
        for n in deleted
        if hf_layout.checkpoints(tmp_path) and n.startswith("checkpoint-") and "." not in n
    ]


def test_a_retried_training_loop_loads_the_optimizer_again(tmp_path: Path) -> None:
    """auto_find_batch_size retries the training loop, which loads the optimizer again:
    it gets the saved state again, never a fresh optimizer."""
    first = _tiny_trainer(tmp_path)
    first.train()
    again = _tiny_trainer(tmp_path)
    folder = str(tmp_path / "checkpoint-4")
    again._load_from_checkpoint(folder)
    again.create_optimizer_and_scheduler(num_training_steps=6)
    again._load_optimizer_and_scheduler(folder)
    again.optimizer.state.clear()  # a retry builds anew
    again._load_optimizer_and_scheduler(folder)
    assert len(again.optimizer.state) > 0


@pytest.mark.xdist_group("gloo")
def test_a_killed_ddp_run_resumes_each_ranks_loader_and_workers(tmp_path: Path) -> None:
    """Two DDP ranks (gloo), random augmentation in two workers per rank (the Trainer seeds
    each rank's workers apart) and an EMA: a job killed mid-epoch resumes each rank from its
    own loader position and worker RNG (rank 1 from rank 0's would train on other inputs)."""
    import sys

    from tests.helpers import launcher

    def job(where: Path, out: Path, kill: int, mode: str) -> int:
        args = [sys.executable, "-m", "tests.helpers.hf_trainer_ddp", str(where), str(out)]
        done = launcher.run(
            [*args, "3", str(kill), mode], cwd=launcher.ROOT, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert done.returncode in (0, 9), done.stderr[-3000:]
        return done.returncode

    assert job(tmp_path / "straight", tmp_path / "straight.st", 0, "augment") == 0
    out = tmp_path / "killed"
    assert job(out, tmp_path / "unused.st", 16, "augment") == 9  # 4 batches a rank an epoch
    assert list(hf_layout.checkpoints(out)) == [12, 15]
    assert job(out, tmp_path / "resumed.st", 0, "resume+augment") == 0
    for rank in ("", ".rank1"):
        _same(tmp_path / f"straight.st{rank}", tmp_path / f"resumed.st{rank}")


def test_the_transformers_example_of_the_docs_resumes_bitwise_after_a_kill(tmp_path: Path) -> None:
    """The user-level example of docs/integrations.md, run to its end; run again, SIGKILLed
    right after its step 10 is committed, then run once more: the same final weights."""
    from tests.helpers.doc_examples import run_killed_and_resumed

    run_killed_and_resumed(tmp_path, "transformers", 10)


def test_an_unseedable_sampler_warns_at_train_start_and_saves_no_loader(tmp_path: Path) -> None:
    trainer = _tiny_trainer(
        tmp_path, max_steps=2, accelerator_config={"use_seedable_sampler": False}
    )
    with pytest.warns(sk.StatekeeperWarning, match="use_seedable_sampler"):
        trainer.train()
    assert "loader" not in sk.read(tmp_path / "checkpoint-2")
    seeded = _tiny_trainer(tmp_path / "seeded", max_steps=2)
    seeded.train()
    assert "loader" in sk.read(tmp_path / "seeded" / "checkpoint-2")
