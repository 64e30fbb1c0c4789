"""StatekeeperCheckpointIO's targets (URLs), its removals under AsyncCheckpointIO, Fabric's step
numbers, and checkpoints written by StatekeeperCallback through Lightning's own CheckpointIO."""

from __future__ import annotations

import functools
import importlib
import os
import threading
import warnings
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from tests.helpers.lightning_pkg import fabric

import statekeeper as sk


@functools.cache
def _kit(name: str) -> SimpleNamespace:
    """The Lightning package ``name``'s classes, and a module and a Trainer made with them."""
    pl = importlib.import_module(name)

    # (typing) the framework package is bound at run time (lightning or pytorch_lightning)
    class Tiny(pl.LightningModule):  # type: ignore[name-defined]
        def __init__(self, width: int = 4) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Linear(width, 1)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Logging(Tiny):
        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            self.log("progress", float(self.global_step))
            return super().training_step(batch, index)

    def trainer(steps: int, callbacks: list[Any], plugins: list[Any]) -> Any:
        saves = any(type(c).__name__ == "ModelCheckpoint" for c in callbacks)
        return pl.Trainer(
            max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
            enable_model_summary=False, callbacks=callbacks, plugins=plugins,
            enable_checkpointing=saves,
        )  # fmt: skip

    return SimpleNamespace(
        Tiny=Tiny, Logging=Logging, trainer=trainer, Fabric=fabric(name).Fabric,
        ModelCheckpoint=pl.callbacks.ModelCheckpoint,
        AsyncCheckpointIO=pl.plugins.io.AsyncCheckpointIO,
    )  # fmt: skip


@pytest.fixture
def kit(lightning: ModuleType) -> SimpleNamespace:
    """Each test under both Lightning packages (``lightning``: tests/integrations/conftest)."""
    return _kit(lightning.__name__)


def _loader() -> Any:
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)


def test_a_url_is_saved_on_its_file_system_not_in_a_local_folder(
    kit: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

    monkeypatch.chdir(tmp_path)
    io = StatekeeperCheckpointIO()
    saves = kit.ModelCheckpoint(dirpath="memory://sk-lightning/run", every_n_train_steps=2)
    trainer = kit.trainer(4, [StatekeeperCallback(), saves], [io])
    trainer.fit(kit.Tiny(), _loader())
    trainer.save_checkpoint("memory://sk-lightning/extra.ckpt")
    assert list(tmp_path.iterdir()) == []  # no folder named "memory:" here
    assert [i.step for i in sk.list_checkpoints("memory://sk-lightning/extra.ckpt")] == [4]
    assert sk.audit.verify("memory://sk-lightning/extra.ckpt").ok
    newest = "memory://sk-lightning/run/epoch=0-step=4.ckpt"
    assert [i.step for i in sk.list_checkpoints(newest)] == [4]
    assert io.load_checkpoint(newest)["global_step"] == 4
    io.remove_checkpoint(newest)
    assert sk.list_checkpoints(newest) == []
    resumed = kit.trainer(6, [StatekeeperCallback()], [StatekeeperCheckpointIO()])
    resumed.fit(kit.Tiny(), _loader(), ckpt_path="memory://sk-lightning/extra.ckpt")
    assert resumed.global_step == 6


def test_modelcheckpoint_on_s3_saves_resumes_and_prunes_there(
    kit: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_server: Any
) -> None:
    """The real S3 protocol (moto's server on localhost, through s3fs): ModelCheckpoint's
    steps are written to the bucket (verified there), its top-k pruning removes them there,
    and a run resumes from one."""

    from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

    monkeypatch.chdir(tmp_path)
    # ModelCheckpoint lists and checks its dirpath on a file system of its own, configured
    # as a user configures s3fs for a job: by the environment (here, the local server only)
    for name, value in {
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    run = f"s3://{s3_server.new_bucket()}/run"
    io = StatekeeperCheckpointIO(storage_options=s3_server.options)
    saves = kit.ModelCheckpoint(
        dirpath=run, every_n_train_steps=2, save_top_k=1, monitor="progress", mode="max"
    )
    trainer = kit.trainer(6, [StatekeeperCallback(), saves], [io])
    trainer.fit(kit.Logging(), _loader())
    assert list(tmp_path.iterdir()) == []  # nothing local named "s3:"
    fs = s3_server.filesystem()
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(run.removeprefix("s3://"), refresh=True))
    assert names == ["epoch=1-step=6.ckpt"]  # top-1 by step: the older two pruned on S3
    newest = f"{run}/epoch=1-step=6.ckpt"
    storage = sk.storage.FsspecStorage(newest, **s3_server.options)
    assert [i.step for i in sk.list_checkpoints(storage)] == [6] and sk.audit.verify(storage).ok
    resumed = kit.trainer(
        8, [StatekeeperCallback()], [StatekeeperCheckpointIO(storage_options=s3_server.options)]
    )
    resumed.fit(kit.Logging(), _loader(), ckpt_path=newest)
    assert resumed.global_step == 8


def test_async_top_k_removal_of_a_checkpoint_still_being_written_waits_for_it(
    kit: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's AsyncCheckpointIO writes on its thread; kit.ModelCheckpoint(save_top_k=1)
    removes the previous checkpoint as soon as it asks for the next. The first save is held
    (on its thread, as it begins writing) until its removal has been asked for: the removal
    waits for it, and only the newest checkpoint is left."""

    import statekeeper.integrations.lightning_io as plugin
    from statekeeper.integrations.lightning import StatekeeperCallback, StatekeeperCheckpointIO

    removing, held = threading.Event(), list[bool]()
    # (typing) an internal function the test drives or wraps
    real = plugin.save  # type: ignore[attr-defined]

    def save(*args: Any, **kwargs: Any) -> Any:
        if not held:
            held.append(True)
            removing.wait(timeout=120)
        return real(*args, **kwargs)

    class Watched(StatekeeperCheckpointIO):
        def remove_checkpoint(self, path: Any) -> None:
            removing.set()
            super().remove_checkpoint(path)

    monkeypatch.setattr(plugin, "save", save)
    io = Watched()
    saves = kit.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=1)
    trainer = kit.trainer(4, [StatekeeperCallback(), saves], [kit.AsyncCheckpointIO(io)])
    trainer.fit(kit.Tiny(), _loader())  # stock Lightning: no error; before: StorageError
    assert removing.is_set()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0-step=4.ckpt"]
    assert sk.audit.verify(tmp_path / "epoch=0-step=4.ckpt").ok


def test_a_removal_of_a_save_still_queued_drops_it(kit: SimpleNamespace, tmp_path: Path) -> None:
    from statekeeper.integrations.lightning import StatekeeperCheckpointIO

    io = StatekeeperCheckpointIO()
    first = threading.Thread(target=io.save_checkpoint, args=({"global_step": 1}, tmp_path / "a"))
    first.start()
    first.join()  # a save on another thread: the plugin is under AsyncCheckpointIO
    io.remove_checkpoint(tmp_path / "b")  # b's save has not begun: it is queued
    later = threading.Thread(target=io.save_checkpoint, args=({"global_step": 2}, tmp_path / "b"))
    later.start()
    later.join()
    assert not os.path.lexists(tmp_path / "b")
    io.save_checkpoint({"global_step": 3}, tmp_path / "b")  # asked for after: written
    assert [i.step for i in sk.list_checkpoints(tmp_path / "b")] == [3]


def test_fabric_saves_are_numbered_by_the_states_step(kit: SimpleNamespace, tmp_path: Path) -> None:

    from statekeeper.integrations.lightning import StatekeeperCheckpointIO

    fabric = kit.Fabric(accelerator="cpu", devices=1, plugins=[StatekeeperCheckpointIO()])
    model = fabric.setup(torch.nn.Linear(2, 1))
    fabric.save(tmp_path / "last", {"model": model, "step": 120})
    assert [i.step for i in sk.list_checkpoints(tmp_path / "last")] == [120]
    fabric.save(tmp_path / "last", {"model": model, "global_step": 130})
    assert [i.step for i in sk.list_checkpoints(tmp_path / "last")] == [130]
    fabric.save(tmp_path / "other", {"model": model})
    assert [i.step for i in sk.list_checkpoints(tmp_path / "other")] == [0]


def test_the_callback_with_lightnings_own_checkpoint_io_writes_loadable_checkpoints(
    kit: SimpleNamespace,
    tmp_path: Path,
) -> None:

    from statekeeper.integrations.lightning import StatekeeperCallback

    saves = kit.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_last=True)
    kit.trainer(4, [StatekeeperCallback(), saves], []).fit(kit.Tiny(), _loader())
    loaded = torch.load(tmp_path / "last.ckpt", weights_only=True)  # Lightning's own load
    assert "statekeeper_rng" in loaded
    resumed = kit.trainer(6, [StatekeeperCallback()], [])
    resumed.fit(kit.Tiny(), _loader(), ckpt_path=tmp_path / "last.ckpt")
    assert resumed.global_step == 6


def test_load_from_checkpoint_builds_the_module_from_a_statekeeper_step(
    kit: SimpleNamespace, tmp_path: Path
) -> None:
    """LightningModule.load_from_checkpoint reads with torch.load and fails on a step (a
    directory); statekeeper's load_from_checkpoint does what it does: hyper-parameters
    (overridden by keywords), weights, strict, map_location."""
    from statekeeper.integrations.lightning import StatekeeperCheckpointIO, load_from_checkpoint

    trainer = kit.trainer(2, [], [StatekeeperCheckpointIO()])
    trained = kit.Tiny(width=4)
    trainer.fit(trained, _loader())
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    with pytest.raises(IsADirectoryError):
        kit.Tiny.load_from_checkpoint(tmp_path / "model.ckpt")  # Lightning's own: no route
    got = load_from_checkpoint(kit.Tiny, tmp_path / "model.ckpt", map_location="cpu")
    assert isinstance(got, kit.Tiny) and got.hparams["width"] == 4
    assert torch.equal(got.net.weight, trained.net.weight)
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_from_checkpoint(kit.Tiny, tmp_path / "model.ckpt", width=3)  # the override is used
    with pytest.raises(sk.errors.InvalidArgumentError, match="pass the class"):
        load_from_checkpoint(trained, tmp_path / "model.ckpt")


class _Noisy(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(4)  # random augmentation, drawn in a worker


def test_a_plain_dataset_in_loader_workers_is_warned_about_at_fit_start(
    kit: SimpleNamespace,
) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from statekeeper.integrations.lightning import StatekeeperCallback

    # (typing) the Lightning package is picked at run time
    class Model(kit.Tiny):  # type: ignore[name-defined]
        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            return self.net(batch).pow(2).mean()

    plain = StatefulDataLoader(_Noisy(), batch_size=4, num_workers=2)
    with pytest.warns(sk.StatekeeperWarning, match=r"WorkerRNGDataset\(dataset\)"):
        kit.trainer(1, [StatekeeperCallback()], []).fit(Model(), plain)
    wrapped = StatefulDataLoader(sk.data.WorkerRNGDataset(_Noisy()), batch_size=4, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sk.StatekeeperWarning)
        kit.trainer(1, [StatekeeperCallback()], []).fit(Model(), wrapped)


def test_an_old_step_the_plugin_cannot_remove_fails_no_save(
    kit: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name saved again (``last.ckpt``) keeps one step: the older one is removed after the
    new one is committed. One that cannot be removed (a mount point: ``EBUSY``, injected for
    that one directory) is warned about and the save succeeds; the next save removes it."""
    import errno

    from statekeeper.integrations.lightning import StatekeeperCheckpointIO

    fabric = kit.Fabric(accelerator="cpu", devices=1, plugins=[StatekeeperCheckpointIO()])
    model = fabric.setup(torch.nn.Linear(2, 1))
    target = tmp_path / "last.ckpt"
    fabric.save(target, {"model": model, "step": 1})
    busy, real_rename = str(target / "step_000000001"), os.rename

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if os.fspath(src) == busy:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), busy)
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.warns(sk.StatekeeperWarning, match=r"could not remove step 1 .*step 2 is saved"):
        fabric.save(target, {"model": model, "step": 2})
    monkeypatch.undo()
    assert [i.step for i in sk.list_checkpoints(target)] == [1, 2]
    assert fabric.load(target, {"model": model})["step"] == 2
    fabric.save(target, {"model": model, "step": 3})
    assert [i.step for i in sk.list_checkpoints(target)] == [3]


_KILLED_REMOVAL = """
import os, signal, sys
from tests.helpers.lightning_pkg import fabric
fabric()  # the Lightning package of the test
from statekeeper.integrations.lightning import StatekeeperCheckpointIO
io = StatekeeperCheckpointIO()
real = os.unlink
def unlink(*args, **kwargs):
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)  # a hard kill after the first file is deleted
os.unlink = unlink
io.remove_checkpoint(sys.argv[1])
"""


def test_a_removal_killed_midway_leaves_no_half_deleted_checkpoint_under_its_name(
    kit: SimpleNamespace, tmp_path: Path
) -> None:
    """ModelCheckpoint's top-k removal, SIGKILLed right after its first file is deleted:
    the checkpoint was renamed aside (``.removing-``) before any file went, so Lightning
    never finds a half-deleted step under the checkpoint's name (before: shutil.rmtree in
    place left a step missing files under ``epoch=0-step=3.ckpt``)."""
    import subprocess
    import sys

    from tests.helpers.launcher import ROOT

    from statekeeper.integrations.lightning import StatekeeperCheckpointIO

    target = tmp_path / "epoch=0-step=3.ckpt"
    StatekeeperCheckpointIO().save_checkpoint({"global_step": 3, "w": torch.ones(64)}, target)
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_REMOVAL, str(target)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == -9, done.stderr[-3000:]
    assert not os.path.lexists(target)
    assert sk.list_checkpoints(target) == []
    (aside,) = tmp_path.iterdir()  # what was left says what it is
    assert aside.name.startswith("epoch=0-step=3.ckpt.removing-")


def test_a_removal_that_fails_is_a_storage_error_naming_the_checkpoint_and_the_fix(
    kit: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint that cannot be removed (a mount point: EBUSY, injected for it) raises
    statekeeper's StorageError naming it and what to do, never a bare OSError; it is whole."""
    import errno

    from statekeeper.integrations.lightning import StatekeeperCheckpointIO

    io = StatekeeperCheckpointIO()
    target = tmp_path / "epoch=0-step=3.ckpt"
    io.save_checkpoint({"global_step": 3}, target)
    real_rename = os.rename

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if os.fspath(src) == str(target):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(target))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(
        sk.errors.StorageError, match=r"epoch=0-step=3\.ckpt.*remove it by hand"
    ) as got:
        io.remove_checkpoint(target)
    assert got.value.errno == errno.EBUSY
    monkeypatch.undo()
    assert [i.step for i in sk.list_checkpoints(target)] == [3] and sk.audit.verify(target).ok
