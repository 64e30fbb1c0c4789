"""Saving through a framework integration against the framework's own default save.

``.venv/bin/python -m bench.integrations [--size-mib 256] [--runs 5]`` builds a model of
about ``--size-mib`` float32 parameters with Adam (one step taken, so three times that in
all) and times, in alternating order, per framework:

- Accelerate: ``Accelerator.save_state(dir)`` (safetensors weights, pickled optimizer and
  RNG, no fsync) against ``statekeeper.integrations.accelerate.save_state`` (one
  checksummed statekeeper step, fsynced); and the same Accelerate save followed by
  ``os.sync()``, so that both are durable when the time stops.
- Lightning: ``trainer.save_checkpoint`` with Lightning's default ``TorchCheckpointIO`` (one
  ``torch.save`` file, no fsync), with and without ``os.sync()``, against the same call
  on a Trainer with ``StatekeeperCheckpointIO``.
- transformers: ``Trainer._save_checkpoint`` (what the Trainer calls at each ``save_steps``:
  ``save_pretrained`` safetensors weights, pickled optimizer, scheduler and RNG, no fsync),
  with and without ``os.sync()``, against the same call on a ``StatekeeperTrainer``.
- torchtitan: ``CheckpointManager.save`` (torchtitan's own manager: DCP, synchronous;
  DCP fsyncs its files) against ``StatekeeperCheckpointManager.save``, both built by their
  ``Config`` over torchtitan's optimizers container (AdamW) and LR schedulers.

Each save goes to a new directory (removed after the round). Reported: the median (min-max)
per contender and statekeeper's time as a multiple of each Accelerate row's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MIB = 1 << 20
Saver = Callable[[Path], object]


def _accelerate_rows(args: argparse.Namespace, root: Path) -> dict[str, list[float]]:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from statekeeper.integrations.accelerate import save_state

    width = 1024
    layers = max(1, args.size_mib * MIB // (4 * width * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    opt = torch.optim.Adam(model.parameters())
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(root)))
    model, opt = accelerator.prepare(model, opt)
    accelerator.backward(model(torch.randn(2, width)).sum())
    opt.step()

    own = lambda path: accelerator.save_state(str(path))  # noqa: E731
    ours = lambda path: save_state(accelerator, path, step=0)  # noqa: E731
    return _rounds(args, root, "Accelerate save_state", own, ours)


def _lightning_rows(args: argparse.Namespace, root: Path) -> dict[str, list[float]]:
    import pytorch_lightning as pl

    from statekeeper.integrations.lightning import StatekeeperCheckpointIO

    width = 1024
    layers = max(1, args.size_mib * MIB // (4 * width * width))

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            out: torch.Tensor = self.net(batch[0]).sum()
            return out

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters())

    def trained(plugins: list[Any]) -> Any:
        torch.manual_seed(0)
        trainer = pl.Trainer(
            max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, plugins=plugins,
        )  # fmt: skip
        data = torch.utils.data.TensorDataset(torch.randn(2, width))
        trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=2))
        return trainer

    default, ours = trained([]), trained([StatekeeperCheckpointIO()])

    own = lambda path: default.save_checkpoint(str(path))  # noqa: E731
    mine = lambda path: ours.save_checkpoint(str(path))  # noqa: E731
    return _rounds(args, root, "Lightning save_checkpoint", own, mine)


def _transformers_rows(args: argparse.Namespace, root: Path) -> dict[str, list[float]]:
    from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments

    from statekeeper.integrations.transformers import StatekeeperTrainer

    width = 1024
    layers = max(1, args.size_mib * MIB // (4 * width * width))

    class Config(PretrainedConfig):
        model_type = "statekeeper-bench"

    class Net(PreTrainedModel):
        config_class = Config

        def __init__(self, config: Config) -> None:
            super().__init__(config)
            self.net = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": self.net(x).pow(2).mean()}

    def trained(kind: type[Trainer]) -> Any:
        torch.manual_seed(0)
        targs = TrainingArguments(
            output_dir=str(root), max_steps=1, per_device_train_batch_size=2, report_to=[],
            use_cpu=True, save_strategy="no", disable_tqdm=True,
        )  # fmt: skip
        data = [{"x": torch.randn(width)} for _ in range(2)]
        trainer = kind(model=Net(Config()), args=targs, train_dataset=data)
        trainer.train()
        return trainer

    def saver(trainer: Any) -> Saver:
        def save(path: Path) -> None:
            trainer.args.output_dir = str(path)
            trainer._save_checkpoint(trainer.model, None)

        return save

    own, ours = saver(trained(Trainer)), saver(trained(StatekeeperTrainer))
    return _rounds(args, root, "Trainer _save_checkpoint", own, ours)


def _torchtitan_rows(args: argparse.Namespace, root: Path) -> dict[str, list[float]]:
    from torchtitan.components.checkpointer import CheckpointManager
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig

    from statekeeper.integrations.torchtitan import StatekeeperCheckpointManager

    width = 1024
    layers = max(1, args.size_mib * MIB // (4 * width * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    groups = [ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3})]
    optimizers = OptimizersContainer.Config(param_groups=groups, implementation="foreach").build(
        model_parts=[model]
    )
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
        optimizers=optimizers, training_steps=10
    )
    model(torch.randn(2, width)).sum().backward()
    optimizers.step()

    def saver(kind: Any) -> Saver:
        def save(path: Path) -> None:
            config = kind.Config(enable=True, folder=str(path), keep_latest_k=0, interval=1)
            manager = config.build(
                dataloader=None, model_parts=[model], optimizers=optimizers,
                lr_schedulers=schedulers, states={}, sd_adapter=None,
            )  # fmt: skip
            manager.save(curr_step=1)
            manager.close()

        return save

    own, ours = saver(CheckpointManager), saver(StatekeeperCheckpointManager)
    return _rounds(args, root, "torchtitan CheckpointManager (DCP)", own, ours)


def _rounds(
    args: argparse.Namespace, root: Path, label: str, own: Saver, ours: Saver
) -> dict[str, list[float]]:
    """The framework's own save (as it is, then followed by ``os.sync()``) and ours, in
    turns; the first round warms up."""

    def synced(path: Path) -> None:
        own(path)
        os.sync()

    contenders = {label: own, f"{label} + sync": synced, "statekeeper": ours}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.runs + 1):  # the first round warms up
        names = list(contenders)
        k = r % len(names)
        for name in names[k:] + names[:k]:
            path = root / f"{name.split()[0]}-{r}.ckpt"
            os.sync()
            start = time.perf_counter()
            contenders[name](path)
            elapsed = time.perf_counter() - start
            if r:
                times[name].append(elapsed)
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(True)
    return times


def _report(framework: str, args: argparse.Namespace, times: dict[str, list[float]]) -> None:
    ours = statistics.median(times["statekeeper"])
    print(f"{framework}, {args.size_mib} MiB of parameters + Adam, {args.runs} rounds:")
    for name, series in times.items():
        median = statistics.median(series)
        print(
            f"  {name:<34} {median:.3f} s ({min(series):.3f}-{max(series):.3f}); "
            f"statekeeper {ours / median:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="integrations-"))
    try:
        _report("Accelerate", args, _accelerate_rows(args, root))
        _report("Lightning", args, _lightning_rows(args, root))
        _report("transformers", args, _transformers_rows(args, root))
        _report("torchtitan", args, _torchtitan_rows(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
