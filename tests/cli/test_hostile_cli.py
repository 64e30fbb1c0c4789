"""Every CLI command on a hostile step: one line naming the file, a non-zero exit, no hang.

The run has an intact step 1 and a hostile step 2 (the newest), so ``ls`` must still list
both and mark step 2, and ``verify`` must report step 2 damaged and step 1 intact.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from tests.helpers.hostile import (
    MANIFEST,
    SHARD,
    finishes,
    replace_with_fifo,
    replace_with_link,
    rewrite_manifest,
    saved_run,
)

STEP2 = "step_000000002"


def _dev_zero(step: Path) -> str:
    replace_with_link(step / SHARD, "/dev/zero")
    return "is a symbolic link, not a regular file"


def _fifo(step: Path) -> str:
    replace_with_fifo(step / SHARD)
    return "is a FIFO (named pipe), not a regular file"


def _fifo_manifest(step: Path) -> str:
    replace_with_fifo(step / MANIFEST)
    return "is a FIFO (named pipe), not a regular file"


def _deep(step: Path) -> str:
    deep = "[" * 50_000 + "]" * 50_000
    rewrite_manifest(step, lambda t: t.replace('"epoch":2', f'"epoch":{deep}'))
    return "nested too deeply"


def _escape(step: Path) -> str:
    rewrite_manifest(step, lambda t: t.replace(f'"{SHARD}"', json.dumps("../" + SHARD)))
    return "is not one path component"


CASES: dict[str, Callable[[Path], str]] = {
    "dev-zero": _dev_zero,
    "fifo": _fifo,
    "fifo-manifest": _fifo_manifest,
    "deep-json": _deep,
    "path-escape": _escape,
}


SHARD_ONLY = {"dev-zero", "fifo"}  # cases that leave the manifest intact


@pytest.fixture(params=sorted(CASES))
def hostile(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str, str]:
    run = saved_run(tmp_path / "run", steps=(1, 2))
    return run, CASES[request.param](run / STEP2), request.param


def _run(invoke: Callable[..., Result], *args: object) -> Result:
    box: list[Result] = []
    error = finishes(lambda: box.append(invoke(*args)))
    assert error is None, repr(error)
    result = box[0]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    return result


def _refused(result: Result, needle: str) -> None:
    assert result.exit_code != 0, result.output
    assert needle in result.output and STEP2 in result.output, result.output


def test_ls_lists_every_step_and_marks_the_hostile_one(
    invoke: Callable[..., Result], hostile: tuple[Path, str, str]
) -> None:
    run, needle, case = hostile
    result = _run(invoke, "ls", run, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    steps = rows["checkpoints"] if isinstance(rows, dict) else rows
    assert [r["step"] for r in steps] == [1, 2]
    errors = {r["step"]: r.get("error") for r in steps}
    assert errors[1] is None
    if case in SHARD_ONLY:  # ls reads manifests only: a bad shard shows in verify
        assert errors[2] is None
    else:
        assert needle in errors[2]


def test_verify_reports_the_hostile_step_and_checks_the_rest(
    invoke: Callable[..., Result], hostile: tuple[Path, str, str]
) -> None:
    run, needle, _ = hostile
    result = _run(invoke, "verify", run)
    _refused(result, needle)
    assert "step_000000001" in result.output


@pytest.mark.parametrize("command", ["inspect", "diff", "convert", "export", "average"])
def test_readers_refuse_the_hostile_step(
    invoke: Callable[..., Result], hostile: tuple[Path, str, str], command: str, tmp_path: Path
) -> None:
    run, needle, case = hostile
    step = run / STEP2
    args: dict[str, tuple[object, ...]] = {
        "inspect": (step,),
        "diff": (run / "step_000000001", step),
        "convert": (step, "-o", tmp_path / "out.safetensors"),
        "export": (step, "-o", tmp_path / "out.safetensors"),
        "average": (run / "step_000000001", step, "-o", tmp_path / "avg"),
    }
    result = _run(invoke, command, *args[command])
    if command == "inspect" and case in SHARD_ONLY:
        assert result.exit_code == 0, result.output  # inspect reads the manifest only
        return
    _refused(result, needle)
    assert not (tmp_path / "out.safetensors").exists()


def test_inspect_refuses_tensor_records_that_claim_more_than_their_file(
    invoke: Callable[..., Result], tmp_path: Path
) -> None:
    run = saved_run(tmp_path / "run", steps=(1, 2))
    rewrite_manifest(run / STEP2, lambda t: t.replace('"shape":[8,8]', '"shape":[1048576,1048576]'))
    result = _run(invoke, "inspect", run / STEP2)
    _refused(result, f"claim {4 * 2**40 + 32} bytes of tensors-00000.safetensors, which holds")
