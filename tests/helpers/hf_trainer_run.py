"""A tiny transformers ``Trainer`` run that checkpoints through statekeeper.

Usage: python -m tests.helpers.hf_trainer_run OUTPUT_DIR OUT_FILE EVERY KILL [MODE
[VERSION_FILE]].
Trains 20 steps (8 batches an epoch: across three epochs) of a one-layer BERT classifier
with dropout, AdamW and a linear schedule with warm-up, saving ``checkpoint-N`` every EVERY
steps (``save_total_limit=2``) with ``StatekeeperTrainer``. After step KILL (0: never) it
SIGKILLs itself; MODE ``kill-in-save`` makes that kill happen inside the save of step KILL,
after everything is written and before the folder is committed. MODE ``resume`` resumes
with ``train(resume_from_checkpoint=True)``. MODE ``augment`` (or ``resume+augment``):
the dataset replaces a token at random in ``__getitem__`` (Python's, numpy's and torch's
RNGs) and the loader has two workers; an EMA of the model (``sk.averaging.AveragedModel``, updated
after every step by a callback) goes into each checkpoint through ``extra_state``; the
first run also calls ``train(resume_from_checkpoint=True)`` (nothing to resume yet);
``persistent`` adds ``dataloader_persistent_workers=True``. At
the end it writes every parameter, the optimizer's moments by parameter name, the loss of
every step the run's history holds, one more random draw, and with ``augment`` the EMA's
parameters and the input ids of every step trained, to OUT_FILE, and the transformers
version to VERSION_FILE.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    TrainerCallback,
    TrainingArguments,
)

import statekeeper as sk
from statekeeper.integrations import hf_layout
from statekeeper.integrations.transformers import StatekeeperTrainer

STEPS = 20


def dataset() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        {
            "input_ids": torch.randint(0, 50, (8,), generator=g),
            "attention_mask": torch.ones(8, dtype=torch.long),
            "labels": torch.randint(0, 2, (), generator=g),
        }
        for _ in range(32)
    ]


class Augmenting(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """``dataset()`` with one token replaced at random by the process that draws the item."""

    def __init__(self) -> None:
        self.items = dataset()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = dict(self.items[i])
        ids = item["input_ids"].clone()
        where = random.randrange(8)
        ids[where] = (int(np.random.randint(0, 50)) + int(torch.randint(0, 50, ()))) % 50
        item["input_ids"] = ids
        return item


class _EMA(TrainerCallback):
    def __init__(self, ema: sk.averaging.AveragedModel) -> None:
        self.ema = ema

    def on_step_end(
        self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
    ) -> None:
        self.ema.update_parameters(model)


def model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    # (typing) a config keyword transformers' signature takes through **kwargs
    config = BertConfig(  # type: ignore[call-arg]
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.3,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


class _Kill(TrainerCallback):
    def __init__(self, after: int) -> None:
        self.after = after

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.after and state.global_step == self.after:  # step `after` is done and saved
            os.kill(os.getpid(), signal.SIGKILL)


def _kill_in_save(at: int) -> None:
    real = hf_layout.commit

    def commit(built: Any, step: int) -> Any:
        if step == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(built, step)

    hf_layout.commit = commit


def main() -> None:
    output_dir, out, every, kill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    modes = set(sys.argv[5].split("+")) if len(sys.argv) > 5 else set()
    augment = "augment" in modes
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        warmup_steps=3,
        save_strategy="steps",
        save_steps=every,
        save_total_limit=2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=2 if augment else 0,
        dataloader_persistent_workers="persistent" in modes,
    )
    callbacks: list[TrainerCallback] = []
    if "kill-in-save" in modes:
        _kill_in_save(kill)
    elif kill:
        callbacks.append(_Kill(kill))
    net = model()
    extra = {}
    if augment:
        ema = sk.averaging.AveragedModel(net, multi_avg_fn=sk.averaging.get_ema_multi_avg_fn(0.9))
        callbacks.append(_EMA(ema))
        extra["ema"] = ema
    inputs: dict[int, torch.Tensor] = {}
    net.register_forward_pre_hook(
        lambda m, a, kw: inputs.__setitem__(trainer.state.global_step + 1, kw["input_ids"]),
        with_kwargs=True,
    )
    data = Augmenting() if augment else dataset()
    trainer = StatekeeperTrainer(
        model=net, args=args, train_dataset=data, callbacks=callbacks, extra_state=extra
    )
    trainer.train(resume_from_checkpoint=True if "resume" in modes or augment else None)
    final = {f"param/{k}": v.detach().clone() for k, v in trainer.model.state_dict().items()}
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    for p, s in inner.state.items():
        final |= {f"adam/{names[id(p)]}/{k}": v.clone() for k, v in s.items() if torch.is_tensor(v)}
    history = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
    final["steps"] = torch.tensor([s for s, _ in history])
    final["losses"] = torch.tensor([loss for _, loss in history], dtype=torch.float64)
    final["draw"] = torch.rand(4)
    if augment:
        final |= {f"ema/{k}": v.detach().clone() for k, v in ema.module.state_dict().items()}
        final |= {f"input/{s}": x.clone() for s, x in inputs.items()}
    rank = int(os.environ.get("RANK", "0"))  # a DDP job (tests.helpers.hf_trainer_ddp)
    save_file({k: v.contiguous() for k, v in final.items()}, f"{out}.rank{rank}" if rank else out)
    if len(sys.argv) > 6:
        with open(sys.argv[6], "w") as f:
            f.write(transformers.__version__)


if __name__ == "__main__":
    main()
