from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from click.testing import Result

import statekeeper

Invoke = Callable[..., Result]
PARTIAL = "step_000000009.partial-abc123"


def test_ls_lists_steps_metrics_and_partial(invoke: Invoke, run_dir: Path) -> None:
    result = invoke("ls", run_dir)
    assert result.exit_code == 0, result.output
    rows = [line.strip("│ ") for line in result.stdout.splitlines()]
    assert [r.split(" │")[0] for r in rows if r.endswith("│ ok")] == ["1", "2"]
    assert "loss=1.5" in result.stdout
    assert "loss=0.75, tokens=1200" in result.stdout
    assert " KiB" in result.stdout  # sizes are human-readable
    assert f"partial (interrupted save, never read): {PARTIAL}" in result.stdout
    assert "2 committed step(s), 1 partial" in result.stdout


def test_ls_json(invoke: Invoke, run_dir: Path) -> None:
    result = invoke("ls", run_dir, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["directory"] == str(run_dir)
    steps = data["checkpoints"]
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[0]["metrics"] == {"loss": 1.5}
    assert steps[1]["metrics"] == {"loss": 0.75, "tokens": 1200}
    for s in steps:
        assert s["error"] is None
        assert s["files"] == 2  # one shard and the manifest
        assert s["bytes"] == sum(f.stat().st_size for f in Path(s["path"]).iterdir())
        assert datetime.fromisoformat(s["created"]).tzinfo is not None
    assert data["partial"] == [{"name": PARTIAL, "step": 9, "kind": "partial"}]


def test_ls_flags_a_damaged_manifest(
    invoke: Invoke,
    run_dir: Path,
    step_dir: Callable[[Path, int], Path],
    flip_byte: Callable[[Path, int], None],
) -> None:
    flip_byte(step_dir(run_dir, 2) / "manifest.json", 40)
    result = invoke("ls", run_dir)
    assert result.exit_code == 0, result.output
    assert "damaged: " in result.stdout and "2 committed step(s), 1 damaged" in result.stdout
    data = json.loads(invoke("ls", run_dir, "--json").stdout)
    errors = {s["step"]: s["error"] for s in data["checkpoints"]}
    assert errors[1] is None
    assert "manifest" in errors[2]


def test_ls_names_set_aside_and_superseded_copies_for_what_they_are(
    invoke: Invoke, run_dir: Path
) -> None:
    """Step 2 exists only as the copy an interrupted overwrite set aside (it is the committed
    step, never "partial"); step 1 has a superseded copy beside it, and a damaged step 3
    was set aside by a restarted run (evidence, apart from the leftovers)."""
    (run_dir / "step_000000002").rename(run_dir / "step_000000002.replaced-00ff")
    (run_dir / "step_000000001.replaced-11aa").mkdir()
    (run_dir / "step_000000003.damaged-22bb").mkdir()
    data = json.loads(invoke("ls", run_dir, "--json").stdout)
    assert [(c["step"], Path(c["path"]).name, c["error"]) for c in data["checkpoints"]] == [
        (1, "step_000000001", None),
        (2, "step_000000002.replaced-00ff", None),
    ]
    assert data["partial"] == [
        {"name": "step_000000001.replaced-11aa", "step": 1, "kind": "replaced"},
        {"name": PARTIAL, "step": 9, "kind": "partial"},
    ]
    assert data["set_aside"] == [
        {"name": "step_000000003.damaged-22bb", "step": 3, "kind": "damaged"}
    ]
    table = invoke("ls", run_dir).stdout
    assert "ok: the copy an interrupted overwrite set aside" in table
    assert (
        "superseded copy (an overwrite replaced it, never read): step_000000001.replaced" in table
    )
    assert "damaged, set aside by a restarted run" in table
    assert "2 committed step(s), 2 partial" in table and "1 damaged set aside" in table


def test_ls_empty_directory(invoke: Invoke, tmp_path: Path) -> None:
    result = invoke("ls", tmp_path)
    assert result.exit_code == 0
    assert "no checkpoints" in result.stdout


def test_ls_missing_directory_exits_2(invoke: Invoke, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = invoke("ls", missing, "--json")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert f"Error: {missing} is not a directory" in result.stderr
    assert "Traceback" not in result.output


def test_ls_on_a_step_directory_points_to_its_run(
    invoke: Invoke, run_dir: Path, step_dir: Callable[[Path, int], Path]
) -> None:
    result = invoke("ls", step_dir(run_dir, 1))
    assert result.exit_code == 2
    assert "single step" in result.stderr and f"statekeeper ls {run_dir}" in result.stderr


def test_ls_json_stays_strict_with_non_finite_metrics(invoke: Invoke, tmp_path: Path) -> None:
    statekeeper.save(tmp_path, {"x": 1}, step=3, metrics={"loss": float("inf")})
    result = invoke("ls", tmp_path, "--json")
    assert "Infinity" not in result.stdout
    (step,) = json.loads(result.stdout)["checkpoints"]
    assert step["metrics"] == {"loss": "inf"}
    assert "loss=inf" in invoke("ls", tmp_path).stdout


def test_ls_with_the_mirror_shows_which_tiers_hold_each_step(
    invoke: Invoke, tmp_path: Path
) -> None:
    import uuid

    import torch

    import statekeeper as sk

    mirror = f"memory://mirror-{uuid.uuid4().hex}"
    x = {"x": torch.zeros(8)}
    with sk.Checkpointer(tmp_path / "run", keep=sk.KeepLatest(1), mirror=sk.Mirror(mirror)) as c:
        for step in (1, 2, 3):
            x["x"] += 1
            c.save(step, x)
            c.wait()  # each upload before the next save: local retention then removes it
    result = invoke("ls", tmp_path / "run", "--mirror", mirror, "--json")
    assert result.exit_code == 0, result.output
    rows = {c["step"]: c["tiers"] for c in json.loads(result.stdout)["checkpoints"]}
    assert rows == {1: ["mirror"], 2: ["mirror"], 3: ["local", "mirror"]}
    table = invoke("ls", tmp_path / "run", "--mirror", mirror).stdout
    assert "tiers" in table and "local+mirror" in table
