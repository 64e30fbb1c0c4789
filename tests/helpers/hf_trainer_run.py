"""A tiny transformers ``Trainer`` run that checkpoints through statekeeper.

Usage: python -m tests.helpers.hf_trainer_run OUTPUT_DIR OUT_FILE EVERY KILL [MODE
[VERSION_FILE]].
Trains 20 steps (8 batches an epoch: across three epochs) of a one-layer BERT classifier
with dropout, AdamW and a linear schedule with warm-up, saving ``checkpoint-N`` every EVERY
steps (``save_total_limit=2``) with ``StatekeeperTrainer``. After step KILL (0: never) it
SIGKILLs itself; MODE ``kill-in-save`` makes that kill happen inside the save of step KILL,
after everything is written and before the folder is committed. MODE ``resume`` resumes
with ``train(resume_from_checkpoint=True)``. At the end it writes every parameter, the
optimizer's moments by parameter name, the loss of every step the run's history holds and
one more random draw to OUT_FILE, and the transformers version to VERSION_FILE.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    TrainerCallback,
    TrainingArguments,
)

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


def model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
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

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.after and state.global_step == self.after:  # step `after` is done and saved
            os.kill(os.getpid(), signal.SIGKILL)


def _kill_in_save(at: int) -> None:
    real = hf_layout.commit

    def commit(built, step):  # type: ignore[no-untyped-def]
        if step == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(built, step)

    hf_layout.commit = commit  # type: ignore[assignment]


def main() -> None:
    output_dir, out, every, kill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else ""
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
    )
    callbacks = []
    if mode == "kill-in-save":
        _kill_in_save(kill)
    elif kill:
        callbacks.append(_Kill(kill))
    trainer = StatekeeperTrainer(
        model=model(), args=args, train_dataset=dataset(), callbacks=callbacks
    )
    trainer.train(resume_from_checkpoint=True if mode == "resume" else None)
    final = {f"param/{k}": v.detach().clone() for k, v in trainer.model.state_dict().items()}
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    for p, s in inner.state.items():
        final |= {f"adam/{names[id(p)]}/{k}": v.clone() for k, v in s.items() if torch.is_tensor(v)}
    history = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
    final["steps"] = torch.tensor([s for s, _ in history])
    final["losses"] = torch.tensor([loss for _, loss in history], dtype=torch.float64)
    final["draw"] = torch.rand(4)
    rank = int(os.environ.get("RANK", "0"))  # a DDP job (tests.helpers.hf_trainer_ddp)
    save_file({k: v.contiguous() for k, v in final.items()}, f"{out}.rank{rank}" if rank else out)
    if len(sys.argv) > 6:
        with open(sys.argv[6], "w") as f:
            f.write(transformers.__version__)


if __name__ == "__main__":
    main()
