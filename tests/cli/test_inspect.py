from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from click.testing import Result

import statekeeper

Invoke = Callable[..., Result]

# Tied (see conftest): embed.weight (6, 4) f32, proj.weight (4, 4) f32, proj.bias (4,) f32,
# head.weight an alias of embed.weight; plus "extra", a (3, 5) bfloat16 tensor.
TORCH = torch.__version__.split("+")[0]  # the manifest records the public version
TENSOR_BYTES = 6 * 4 * 4 + 4 * 4 * 4 + 4 * 4 + 3 * 5 * 2


def _json(invoke: Invoke, *args: object) -> dict[str, Any]:
    result = invoke("inspect", *args, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_inspect_shows_tensors_alias_values_and_totals(invoke: Invoke, run_dir: Path) -> None:
    result = invoke("inspect", run_dir)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "step 2" in out and "loss=0.75, tokens=1200" in out
    assert f"torch {TORCH}" in out and f"statekeeper {statekeeper.__version__}" in out
    rows = {line.split("│")[0].strip(): line for line in out.splitlines() if "│" in line}
    assert "(6, 4)" in rows["embed.weight"] and "float32" in rows["embed.weight"]
    assert "96 B" in rows["embed.weight"]
    assert "(4,)" in rows["proj.bias"] and "16 B" in rows["proj.bias"]
    assert "alias of model/embed.weight" in rows["head.weight"] and "0 B" in rows["head.weight"]
    assert "bfloat16" in rows["extra"] and "(3, 5)" in rows["extra"] and "30 B" in rows["extra"]
    assert "epoch (int) = 2" in out
    assert "'tiny'" in rows["name"]
    assert "<list of 500 int>" in rows["ids"]
    assert f"total: 5 tensor(s) (4 stored, 1 alias(es)), {TENSOR_BYTES} bytes" in out
    assert "2 file(s)" in out
    assert "alias: model/head.weight -> model/embed.weight" in out


def test_inspect_json_structure(invoke: Invoke, run_dir: Path) -> None:
    data = _json(invoke, run_dir)
    assert data["step"] == 2
    assert data["path"].endswith("step_000000002")
    assert data["metrics"] == {"loss": 0.75, "tokens": 1200}
    assert data["library"]["torch"] == TORCH
    entries = {e["name"]: e for e in data["entries"]}
    assert list(entries) == ["model", "extra", "epoch", "config"]
    model = {t["name"]: t for t in entries["model"]["tensors"]}
    assert list(model) == [
        "model/embed.weight",
        "model/proj.weight",
        "model/proj.bias",
        "model/head.weight",
    ]
    assert model["model/embed.weight"] == {
        "name": "model/embed.weight",
        "key": "embed.weight",
        "shape": [6, 4],
        "dtype": "float32",
        "bytes": 96,
        "file": "tensors-00000.safetensors",
        "alias_of": None,
        "numpy": False,
        "in_state": True,
        "chunks": 0,
    }
    assert model["model/head.weight"]["alias_of"] == "model/embed.weight"
    assert model["model/head.weight"]["bytes"] == 0
    assert model["model/head.weight"]["shape"] == [6, 4]
    assert entries["model"]["tensor_bytes"] == 96 + 64 + 16
    assert entries["extra"]["tensors"][0]["dtype"] == "bfloat16"
    assert entries["epoch"]["values"] == [
        {"path": "epoch", "key": "", "type": "int", "value": "2", "complete": True}
    ]
    config = {v["key"]: v for v in entries["config"]["values"]}
    assert config["lr"]["value"] == "0.01" and config["lr"]["complete"]
    assert config["ids"]["complete"] is False
    assert data["aliases"] == {"model/head.weight": "model/embed.weight"}
    size = sum(f.stat().st_size for f in Path(data["path"]).iterdir())
    assert data["totals"] == {
        "tensors": 5,
        "stored": 4,
        "aliases": 1,
        "tensor_bytes": TENSOR_BYTES,
        "values": 4,
        "files": 2,
        "file_bytes": size,
        "written_bytes": size,  # step 2's tensors differ from step 1's: nothing reused
    }
    assert data["reused"] == {}


def test_inspect_step_option_and_step_directory(
    invoke: Invoke, run_dir: Path, step_dir: Callable[[Path, int], Path]
) -> None:
    assert _json(invoke, run_dir, "--step", 1)["metrics"] == {"loss": 1.5}
    direct = _json(invoke, step_dir(run_dir, 1))
    assert direct["step"] == 1 and direct["entries"][2]["values"][0]["value"] == "1"


def test_inspect_numpy_and_optimizer_like_state(invoke: Invoke, tmp_path: Path) -> None:
    # what Adam's state_dict() looks like (int keys), without paying for an optimizer step
    opt_state = {
        "state": {
            i: {"step": torch.tensor(1.0), "exp_avg": torch.ones(3), "exp_avg_sq": torch.ones(3)}
            for i in range(2)
        },
        "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "params": [0, 1]}],
    }
    statekeeper.save(tmp_path, {"opt": opt_state, "arr": np.arange(4, dtype=np.int16)}, step=0)
    data = _json(invoke, tmp_path)
    entries = {e["name"]: e for e in data["entries"]}
    assert entries["arr"]["tensors"][0]["numpy"] is True
    assert entries["arr"]["tensors"][0]["dtype"] == "int16"
    assert entries["arr"]["tensors"][0]["bytes"] == 8
    keys = [t["key"] for t in entries["opt"]["tensors"]]
    assert keys == [
        "state/0/step",
        "state/0/exp_avg",
        "state/0/exp_avg_sq",
        "state/1/step",
        "state/1/exp_avg",
        "state/1/exp_avg_sq",
    ]
    assert entries["opt"]["tensor_bytes"] == 2 * (4 + 12 + 12)
    values = {v["key"]: v for v in entries["opt"]["values"]}
    assert values["param_groups/0/betas"] == {
        "path": "opt/param_groups/0/betas",
        "key": "param_groups/0/betas",
        "type": "tuple",
        "value": "(0.9, 0.999)",
        "complete": True,
    }


def test_inspect_reads_only_the_manifest(
    invoke: Invoke,
    run_dir: Path,
    step_dir: Callable[[Path, int], Path],
    shard: Callable[[Path], Path],
    flip_byte: Callable[[Path, int], None],
) -> None:
    flip_byte(shard(step_dir(run_dir, 2)), -1)
    assert _json(invoke, run_dir)["totals"]["tensor_bytes"] == TENSOR_BYTES


def test_inspect_damaged_manifest_is_one_red_line(
    invoke: Invoke,
    run_dir: Path,
    step_dir: Callable[[Path, int], Path],
    flip_byte: Callable[[Path, int], None],
) -> None:
    flip_byte(step_dir(run_dir, 2) / "manifest.json", 40)
    result = invoke("inspect", run_dir)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and "manifest.json" in result.stderr
    assert "Traceback" not in result.output


def test_inspect_missing_step_or_directory_exits_2(invoke: Invoke, run_dir: Path) -> None:
    result = invoke("inspect", run_dir, "--step", 7)
    assert result.exit_code == 2
    assert "does not exist; committed steps: 1, 2" in result.stderr
    assert invoke("inspect", run_dir / "nope").exit_code == 2


def test_main_version_and_help(invoke: Invoke) -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and statekeeper.__version__ in result.stdout
    help_text = invoke("--help").stdout
    assert all(name in help_text for name in ("ls", "inspect", "verify"))


def test_piped_output_never_folds_a_name_mid_word(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from statekeeper.cli.main import main

    name = "encoder.layers.0.self_attention.query_key_value.weight_with_a_long_name"
    statekeeper.save(tmp_path, {"model": {name: torch.ones(2)}}, step=1)
    result = CliRunner(env={"COLUMNS": "60"}).invoke(main, ["inspect", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert any(name in line for line in result.output.splitlines())


def test_ls_and_inspect_show_what_an_incremental_save_wrote(invoke: Invoke, tmp_path: Path) -> None:
    run = tmp_path / "run"
    frozen = torch.arange(4096, dtype=torch.float32)
    for step in (1, 2, 3):  # step 2 is written whole: a second copy that shares no data
        statekeeper.save(run, {"frozen": frozen}, step=step)  # step 3: all of it reused
    result = invoke("ls", run, "--json")
    assert result.exit_code == 0, result.output
    listed = {c["step"]: c for c in json.loads(result.stdout)["checkpoints"]}
    assert listed[1]["written"] == listed[1]["bytes"] and listed[1]["reused_files"] == 0
    manifest = (run / "step_000000003" / "manifest.json").stat().st_size
    assert listed[3]["written"] == manifest and listed[3]["reused_files"] == 1
    table = invoke("ls", run).stdout
    assert "written" in table and "all" in table
    data = _json(invoke, run)
    assert data["totals"]["written_bytes"] == manifest
    text = invoke("inspect", run).stdout
    assert "reused 1 unchanged file(s)" in text
    assert "reused: tensors-00000.safetensors = step_000000001/tensors-00000.safetensors" in text
