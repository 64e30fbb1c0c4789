"""`statekeeper ls` and `inspect` on foreign checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from click.testing import CliRunner, Result
from tests.interop import formats

from statekeeper.cli.main import main


def _run(*args: object) -> Result:
    return CliRunner(env={"COLUMNS": "240"}).invoke(main, [str(a) for a in args])


def test_ls_lists_the_files_of_each_format(
    tmp_path: Path, accelerate: tuple[Path, dict[str, Any]]
) -> None:
    hf = formats.hf_folder(tmp_path / "hf", formats.weights())
    result = _run("ls", hf)
    assert result.exit_code == 0, result.output
    assert "(huggingface)" in result.stdout and "model-00001-of-00002.safetensors" in result.stdout
    data = json.loads(_run("ls", hf, "--json").stdout)
    assert data["format"] == "huggingface"
    assert [f["role"] for f in data["files"]] == ["index", "weights", "weights"]
    acc = json.loads(_run("ls", accelerate[0], "--json").stdout)
    roles = {f["name"]: f["role"] for f in acc["files"]}
    assert roles["optimizer.bin"] == "optimizer" and roles["model.safetensors"] == "model"
    dcp = formats.dcp_folder(tmp_path / "dcp", {"w": torch.ones(2)})
    assert {f["role"] for f in json.loads(_run("ls", dcp, "--json").stdout)["files"]} == {
        "metadata",
        "data",
    }


def test_inspect_shows_tensors_values_and_ties(tmp_path: Path) -> None:
    model = formats.TiedLM()
    path = formats.torch_file(tmp_path / "lm.pt", {"model": model.state_dict(), "epoch": 5})
    result = _run("inspect", path)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "(torch)" in out and "model.embed.weight" in out and "(7, 4)" in out
    assert "alias of model.embed.weight" in out
    assert "total: 4 tensor(s) (1 alias(es))" in out
    data = json.loads(_run("inspect", path, "--json").stdout)
    tensors = {t["key"]: t for t in data["tensors"]}
    assert tensors["model.lm_head.weight"]["alias_of"] == "model.embed.weight"
    assert tensors["model.lm_head.weight"]["bytes"] == 0
    assert data["values"] == [{"key": "epoch", "type": "int", "value": "5"}]


def test_inspect_refuses_unsafe_files(tmp_path: Path) -> None:
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hook": print}, path)
    result = _run("inspect", path)
    assert result.exit_code == 1 and "builtins.print" in result.stderr
