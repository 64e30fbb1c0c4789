"""The plugin, the callback and the strategy are classes of the Lightning package in use:
with both packages imported (as here), the callback and the plugin are taken by either
package's Trainer, and the strategy is named for one."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import statekeeper as sk

pl = pytest.importorskip("pytorch_lightning")
L = pytest.importorskip("lightning")


def _trainer(package: object, callbacks: list[object], plugins: list[object]) -> object:
    # (typing) the framework package is bound at run time (lightning or pytorch_lightning)
    return package.Trainer(  # type: ignore[attr-defined]
        accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks, plugins=plugins,
    )  # fmt: skip


def test_with_both_packages_imported_either_trainer_takes_the_callback_and_the_plugin() -> None:
    from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

    callback, io = StatekeeperCallback(), StatekeeperCheckpointIO()
    assert isinstance(callback, pl.Callback) and isinstance(callback, L.pytorch.Callback)
    assert isinstance(io, L.fabric.plugins.CheckpointIO)
    # (typing) a property of Lightning's Callback, typed Any
    assert isinstance(callback, StatekeeperCallback) and callback.state_key == "StatekeeperCallback"  # type: ignore[attr-defined]
    for package in (pl, L):  # before: lightning's Trainer refused both ("invalid type")
        trainer = _trainer(package, [callback], [io])
        # (typing) the framework package is bound at run time (lightning or pytorch_lightning)
        assert trainer.strategy.checkpoint_io is io  # type: ignore[attr-defined]
    again = pickle.loads(pickle.dumps(callback))  # ddp_spawn pickles the Trainer's callbacks
    assert type(again) is type(callback)


def test_the_strategy_is_named_for_one_package_when_both_are_imported() -> None:
    from statekeeper.integrations.lightning import StatekeeperModelParallelStrategy

    with pytest.raises(sk.errors.InvalidArgumentError, match=r'\.of\("lightning"\)'):
        StatekeeperModelParallelStrategy()
    unified = StatekeeperModelParallelStrategy.of("lightning")()
    assert isinstance(unified, L.pytorch.strategies.ModelParallelStrategy)
    assert not isinstance(unified, pl.strategies.ModelParallelStrategy)
    assert isinstance(unified, StatekeeperModelParallelStrategy)
    plain = StatekeeperModelParallelStrategy.of("pytorch_lightning")()
    assert isinstance(plain, pl.strategies.ModelParallelStrategy)
    with pytest.raises(sk.errors.InvalidArgumentError, match="pytorch_lightning"):
        StatekeeperModelParallelStrategy.of("lightening")


def test_load_from_checkpoint_uses_the_modules_own_package(tmp_path: Path) -> None:
    import torch

    from statekeeper.integrations.lightning import StatekeeperCheckpointIO, load_from_checkpoint

    # (typing) the framework package is bound at run time (lightning or pytorch_lightning)
    class Unified(L.LightningModule):  # type: ignore[name-defined]
        def __init__(self, width: int = 3) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Linear(width, 1)

    model = Unified()
    target = tmp_path / "m.ckpt"
    checkpoint = {
        "global_step": 1,
        "state_dict": model.state_dict(),
        "hyper_parameters": {"width": 3},
    }
    StatekeeperCheckpointIO().save_checkpoint(checkpoint, target)
    got = load_from_checkpoint(Unified, target)
    assert isinstance(got, Unified) and torch.equal(got.net.weight, model.net.weight)


_ONE_PACKAGE = """
import sys
sys.modules[{hidden!r}] = None  # this package is not installed, for this process
import pickle
import {root} as pl
import {io_root} as fabric_io
from statekeeper.integrations.lightning import (
    StatekeeperCallback, StatekeeperCheckpointIO, StatekeeperModelParallelStrategy,
)
assert issubclass(StatekeeperCallback, pl.Callback), StatekeeperCallback.__mro__
assert issubclass(StatekeeperCheckpointIO, fabric_io.CheckpointIO)
assert issubclass(StatekeeperModelParallelStrategy, pl.strategies.ModelParallelStrategy)
assert pickle.loads(pickle.dumps(StatekeeperCallback)) is StatekeeperCallback
callback = StatekeeperCallback()
assert type(callback) is StatekeeperCallback and callback.state_key == "StatekeeperCallback"
assert type(pickle.loads(pickle.dumps(callback))) is StatekeeperCallback
trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                     callbacks=[callback], plugins=[StatekeeperCheckpointIO()])
assert callback in trainer.callbacks
print("ok")
"""


@pytest.mark.parametrize(
    ("root", "io_root", "hidden"),
    [("pytorch_lightning", "lightning_fabric.plugins", "lightning"),
     ("lightning.pytorch", "lightning.fabric.plugins", "pytorch_lightning")],
)  # fmt: skip
def test_with_one_package_installed_the_classes_are_its_subclasses_at_import(
    root: str, io_root: str, hidden: str
) -> None:
    """One package installed (the common case): the public classes are that package's
    subclasses by name (before: package-free fronts, so issubclass was False, the class
    did not pickle and a class_path config was refused)."""
    import subprocess
    import sys

    code = _ONE_PACKAGE.format(hidden=hidden, root=root, io_root=io_root)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_subclass_of_a_named_strategy_is_not_made_again() -> None:
    """``class Mine(StatekeeperModelParallelStrategy.of("lightning"))`` keeps its own class
    (before: ``Mine()`` was made again, from ``Mine``, and refused with both imported)."""
    from statekeeper.integrations.lightning import StatekeeperModelParallelStrategy

    class Own(StatekeeperModelParallelStrategy.of("lightning")):
        pass

    own = Own()
    assert type(own) is Own and isinstance(own, L.pytorch.strategies.ModelParallelStrategy)


def test_a_strategy_pickles_through_lightnings_own_getstate() -> None:
    """Lightning's ``Strategy.__getstate__`` drops ``_lightning_optimizers`` (they do not
    pickle) and ``__setstate__`` remakes them; the strategy pickles as the stock one does
    (before: its own reduce pickled the whole ``__dict__`` and failed)."""
    import threading

    from statekeeper.integrations.lightning import StatekeeperModelParallelStrategy

    stock = L.pytorch.strategies.ModelParallelStrategy()
    ours = StatekeeperModelParallelStrategy.of("lightning")()
    for strategy in (stock, ours):
        strategy._lightning_optimizers = [threading.Lock()]  # unpicklable, as theirs are
        again = pickle.loads(pickle.dumps(strategy))
        assert type(again) is type(strategy) and again._lightning_optimizers == []
