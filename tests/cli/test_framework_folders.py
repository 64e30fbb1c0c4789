"""``ls``, ``verify`` and ``inspect`` on the folders the frameworks keep their checkpoints in
(a Lightning ModelCheckpoint directory, a Trainer output directory, an Accelerate project
directory), written by the real frameworks, with statekeeper's integrations and without."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import Result
from tests.helpers import launcher
from tests.helpers.no_torch import REFUSE_TORCH

import statekeeper as sk


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("frameworks")
    done = launcher.run(
        [sys.executable, "-m", "tests.helpers.framework_folders", str(out)],
        cwd=launcher.ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture
def folder(written: Path, tmp_path: Path) -> Callable[[str], Path]:
    """A copy of one written folder (``lightning-sk``...), free to damage."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        if not target.exists():
            shutil.copytree(written / name, target, symlinks=True)
        return target

    return copy


def _json(result: Result) -> dict[str, object]:
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.output)
    return data


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_ls_lists_the_statekeeper_steps_of_a_lightning_modelcheckpoint_directory(
    invoke: Callable[..., Result], folder: Callable[[str], Path]
) -> None:
    where = folder("lightning-sk")
    listed = _json(invoke("ls", where, "--json"))
    assert listed["framework"] == "lightning"
    entries = listed["entries"]
    assert isinstance(entries, list)
    assert [(e["name"], e["format"]) for e in entries] == [
        ("epoch=0-step=2.ckpt", "statekeeper"),
        ("epoch=0-step=4.ckpt", "statekeeper"),
        ("last.ckpt", "statekeeper"),
    ]
    assert [[c["step"] for c in e["checkpoints"]] for e in entries] == [[2], [4], [4]]
    assert all(c["error"] is None for e in entries for c in e["checkpoints"])
    shown = invoke("ls", where)
    assert shown.exit_code == 0 and "no checkpoints" not in shown.output
    assert "epoch=0-step=4.ckpt" in shown.output and "3 statekeeper step(s)" in shown.output
    mirrored = invoke("ls", where, "--mirror", "memory://elsewhere")
    assert mirrored.exit_code == 2 and "--mirror applies to a run directory" in mirrored.output


def test_verify_checks_every_byte_of_each_lightning_step(
    invoke: Callable[..., Result], folder: Callable[[str], Path]
) -> None:
    where = folder("lightning-sk")
    good = invoke("verify", where)
    assert good.exit_code == 0, good.output
    assert good.output.count("OK ") == 3 and "3 verified" in good.output
    (shard,) = (where / "epoch=0-step=2.ckpt" / "step_000000002").glob("*.safetensors")
    _flip_last_byte(shard)
    bad = invoke("verify", where, "--json")
    assert bad.exit_code == 1
    report = json.loads(bad.output)
    assert [e["status"] for e in report["entries"]] == ["damaged", "verified", "verified"]
    assert shard.name in report["entries"][0]["error"] and report["ok"] is False
    assert invoke("verify", where, "--step", "4").exit_code == 0  # the intact step alone
    assert sk.audit.verify(where, step=4).ok and not sk.audit.verify(where).ok  # the Python API too


def test_stock_lightning_checkpoints_are_read_by_the_restricted_reader_only(
    invoke: Callable[..., Result], folder: Callable[[str], Path], tmp_path: Path
) -> None:
    where = folder("lightning-stock")
    listed = _json(invoke("ls", where, "--json"))
    # (typing) JSON read back
    assert [e["format"] for e in listed["entries"]] == ["lightning"] * 3  # type: ignore[attr-defined]
    checked = invoke("verify", where)
    assert checked.exit_code == 0, checked.output
    assert checked.output.count("READ ") == 3 and "no checksums" in checked.output
    marker = tmp_path / "executed"
    evil = {"state_dict": {}, "pytorch-lightning_version": "2.6.0", "x": _Evil(str(marker))}
    torch.save(evil, where / "epoch=0-step=6.ckpt")
    truncated = where / "epoch=0-step=2.ckpt"
    truncated.write_bytes(truncated.read_bytes()[:-100])
    report = json.loads(invoke("verify", where, "--json").output)
    statuses = {e["name"]: e["status"] for e in report["entries"]}
    assert statuses == {"epoch=0-step=2.ckpt": "damaged", "epoch=0-step=4.ckpt": "read",
                        "epoch=0-step=6.ckpt": "refused", "last.ckpt": "read"}  # fmt: skip
    assert invoke("verify", where).exit_code == 1
    assert not marker.exists()  # the pickle's code never ran


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.system, (f"touch {self.marker}",))


def test_trainer_checkpoint_folders_are_listed_and_verified_with_their_trainer_files(
    invoke: Callable[..., Result], folder: Callable[[str], Path]
) -> None:
    where = folder("hf-sk")
    listed = _json(invoke("ls", where, "--json"))
    assert listed["framework"] == "transformers"
    entries = listed["entries"]
    # (typing) JSON read back
    assert [(e["name"], [c["step"] for c in e["checkpoints"]]) for e in entries] == [  # type: ignore[attr-defined]
        ("checkpoint-2", [2]), ("checkpoint-4", [4]),
    ]  # fmt: skip
    assert invoke("verify", where).exit_code == 0
    _flip_last_byte(where / "checkpoint-4" / "model.safetensors")  # the Trainer's file
    bad = invoke("verify", where)
    assert bad.exit_code == 1 and "model.safetensors does not match" in bad.output
    stock = folder("hf-stock")
    report = _json(invoke("verify", stock, "--json"))
    (first, _) = report["entries"]
    assert first["status"] == "read" and first["format"] == "huggingface"
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(first["unread"])


def test_accelerate_project_directories_are_listed_and_verified(
    invoke: Callable[..., Result], folder: Callable[[str], Path]
) -> None:
    where = folder("accelerate-sk")
    listed = _json(invoke("ls", where, "--json"))
    (entry,) = listed["entries"]
    assert entry["name"] == "checkpoints" and [c["step"] for c in entry["checkpoints"]] == [0, 1]
    assert _json(invoke("verify", where, "--json"))["ok"] is True
    assert invoke("verify", where, "--step", "1").exit_code == 0
    stock = folder("accelerate-stock")
    listed = _json(invoke("ls", stock, "--json"))
    # (typing) JSON read back
    names = [(e["name"], e["step"], e["format"]) for e in listed["entries"]]  # type: ignore[attr-defined]
    assert names == [("checkpoints/checkpoint_0", 0, "accelerate"),
                     ("checkpoints/checkpoint_1", 1, "accelerate")]  # fmt: skip
    report = _json(invoke("verify", stock, "--json"))
    # (typing) JSON read back
    assert [e["status"] for e in report["entries"]] == ["read", "read"]  # type: ignore[attr-defined]


def test_inspect_shows_the_newest_entry_or_the_step_asked(
    invoke: Callable[..., Result], folder: Callable[[str], Path]
) -> None:
    lightning = folder("lightning-sk")
    assert _json(invoke("inspect", lightning, "--json"))["step"] == 4
    assert _json(invoke("inspect", lightning, "--step", "2", "--json"))["step"] == 2
    assert _json(invoke("inspect", folder("accelerate-sk"), "--step", "0", "--json"))["step"] == 0
    stock = _json(invoke("inspect", folder("lightning-stock"), "--step", "2", "--json"))
    # (typing) JSON read back
    assert stock["format"] == "lightning" and stock["path"].endswith("epoch=0-step=2.ckpt")  # type: ignore[attr-defined]
    missing = invoke("inspect", folder("hf-stock"), "--step", "7")
    assert missing.exit_code == 2 and "steps there: 2, 4" in missing.output


def test_ls_and_verify_of_statekeeper_steps_there_never_import_torch(
    folder: Callable[[str], Path],
) -> None:
    child = REFUSE_TORCH + "\nfrom statekeeper.cli.main import main\nmain(sys.argv[1:])\n"
    for name in ("lightning-sk", "hf-sk", "accelerate-sk"):
        for args in (
            ("ls", folder(name)),
            ("verify", folder(name)),
            ("ls", folder(name), "--json"),
        ):
            done = subprocess.run(
                [sys.executable, "-c", child, *map(str, args)],
                capture_output=True, text=True, check=False, timeout=600,
            )  # fmt: skip
            assert done.returncode == 0, (args, done.stderr[-2000:])
