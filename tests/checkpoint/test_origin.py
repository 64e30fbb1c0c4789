"""Provenance in every step: the versions that wrote it and where (host, command line,
world size, devices, git state), shown by inspect and ls --json; loading a step of another
torch release warns once."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import statekeeper as sk
from statekeeper import lanes
from statekeeper.checkpoint import origin as origin_module
from statekeeper.checkpoint.writer import write_step
from statekeeper.cli.main import main as cli
from statekeeper.storage.local import LocalStorage


def test_every_new_step_records_its_versions_and_origin(tmp_path: Path) -> None:
    info = sk.save(tmp_path, {"w": torch.ones(2)}, step=3)
    assert {"statekeeper", "torch", "python", "numpy"} <= set(info.library)
    assert info.origin["world_size"] == 1 and "cpu" in info.origin["devices"]
    assert info.origin["hostname"] and isinstance(info.origin["argv"], list)
    report = sk.audit.inspect(tmp_path)
    assert report.origin == info.origin
    listed = CliRunner().invoke(cli, ["ls", str(tmp_path), "--json"])
    row = json.loads(listed.output)["checkpoints"][0]
    assert row["origin"] == info.origin and row["library"] == info.library
    shown = CliRunner().invoke(cli, ["inspect", str(tmp_path)])
    assert "origin   " + info.origin["hostname"] in shown.output


def test_a_pinned_provenance_writes_no_origin_member(tmp_path: Path) -> None:
    """The golden files pin created and library: their bytes stay what they were."""
    write_step(
        LocalStorage(tmp_path), {"w": torch.ones(1)}, step=1,
        created="2024-01-01T00:00:00.000000Z", library={"statekeeper": "0.1.0", "torch": "2.4.0"},
    )  # fmt: skip
    text = (tmp_path / "step_000000001" / "manifest.json").read_text()
    assert '"origin"' not in text


def test_a_step_of_another_torch_release_warns_once(tmp_path: Path) -> None:
    write_step(
        LocalStorage(tmp_path), {"w": torch.ones(1)}, step=1,
        created="2024-01-01T00:00:00.000000Z",
        library={"statekeeper": "0.1.0", "torch": "1.99.0"},
    )  # fmt: skip
    origin_module._warned.clear()
    live = {"w": torch.zeros(1)}
    with pytest.warns(sk.StatekeeperWarning, match=r"saved by torch 1\.99\.0"):
        sk.load(tmp_path, live)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sk.StatekeeperWarning)
        sk.load(tmp_path, live)  # once per pair of versions
    assert torch.equal(live["w"], torch.ones(1))
    for saved in ("golden", "", torch.__version__):  # nothing to compare, or the same release
        with warnings.catch_warnings():
            warnings.simplefilter("error", sk.StatekeeperWarning)
            origin_module.warn_if_other_torch({"torch": saved}, "step")
            origin_module.warn_if_other_torch({}, "step")


def test_the_git_state_of_the_working_tree(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    assert origin_module._git_state(str(tmp_path)) == {}  # not a repository: left out
    repo = tmp_path / "repo"

    def settled(where: Path) -> dict[str, object]:
        """The state once the dirty flag (read on the git lane) has come in."""
        origin_module._git_state(str(where))
        lanes.drain("git")
        return origin_module._git_state(str(where))

    repo.mkdir()
    tmp_path = repo
    git("init", "-q")
    (repo / "train.py").write_text("print(1)\n")
    git("add", "train.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    state = settled(repo)
    assert len(state["commit"]) == 40 and state["dirty"] is False
    (repo / "train.py").write_text("print(2)\n")
    sub = repo / "sub"
    sub.mkdir()
    assert settled(sub)["dirty"] is True  # read once per folder


def test_an_origin_that_is_not_an_object_makes_the_manifest_corrupt() -> None:
    from statekeeper.format.checksum import checksum
    from statekeeper.format.manifest import Manifest

    good = Manifest(
        step=1, created="c", library={}, metrics={}, files={}, tensors={}, aliases={},
        state={}, origin={"hostname": "h"},
    )  # fmt: skip
    assert Manifest.from_bytes("m", good.to_bytes()).origin == {"hostname": "h"}
    text = good.to_bytes().decode().replace('"origin":{"hostname":"h"}', '"origin":[1]')
    head, _, _ = text.rpartition('"manifest_checksum":"xxh3_128:')
    zeroed = head + '"manifest_checksum":"xxh3_128:' + "0" * 32 + '"\n}\n'
    digest = checksum(zeroed.encode()).split(":", 1)[1]
    resealed = zeroed.replace("0" * 32 + '"\n}', digest + '"\n}')
    with pytest.raises(sk.CorruptCheckpointError, match="origin is a list"):
        Manifest.from_bytes("m", resealed.encode())


def test_origin_never_fails_a_save_and_escapes_what_it_cannot_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> int:
        raise RuntimeError("the process group is gone")

    monkeypatch.setattr(origin_module, "_world_size", broken)
    monkeypatch.setattr("sys.argv", ["train.py", "--name=caf\udce9", "x" * 5000])
    info = sk.save(tmp_path, {"w": torch.ones(1)}, step=1)
    assert "world_size" not in info.origin and info.origin["hostname"]  # left out; saved
    argv = info.origin["argv"]
    assert argv[0] == "train.py" and argv[1] == "--name=caf\\xe9"
    assert argv[2].endswith("[cut]") and sum(len(a) for a in argv) < 2100
    raw = (tmp_path / "step_000000001" / "manifest.json").read_bytes()
    assert b"\\\\xe9" in raw and b"\\udc" not in raw.lower()


def test_reading_the_git_state_leaves_the_index_alone(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    (tmp_path / "a.py").touch()  # stat data changed: a plain `git status` rewrites the index
    index = tmp_path / ".git" / "index"
    before = index.stat().st_mtime_ns
    origin_module._read_dirty(str(tmp_path))
    assert origin_module._dirty[str(tmp_path)] is False
    assert index.stat().st_mtime_ns == before
