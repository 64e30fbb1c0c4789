"""Bad input on the command line: a clear message and the documented exit code, never a raw
traceback, a silent success or a write into the wrong place."""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import Result
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode

import statekeeper as sk


def raising_factory() -> torch.nn.Module:
    raise RuntimeError("no GPU on this node")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_doctor_on_a_factory_that_raises_names_it_and_exits_3(
    invoke: Callable[..., Result], as_json: bool
) -> None:
    result = invoke("doctor", f"{__name__}:raising_factory", *(["--json"] if as_json else []))
    assert result.exit_code == 3, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    message = result.stderr if result.stderr_bytes else result.output
    assert f"the factory {__name__}:raising_factory raised RuntimeError: no GPU on this node" in (
        message
    )
    assert "fix the factory" in message


def test_doctor_on_a_module_that_raises_on_import_exits_3(
    invoke: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_train_module.py").write_text("raise ValueError('bad config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_train_module", raising=False)
    result = invoke("doctor", "broken_train_module:build")
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    assert "importing 'broken_train_module' raised ValueError: bad config" in result.output


def test_ls_with_a_mirror_that_does_not_exist_exits_2(
    invoke: Callable[..., Result], run_dir: Path, tmp_path: Path
) -> None:
    result = invoke("ls", run_dir, "--mirror", tmp_path / "no-such-mirror")
    assert result.exit_code == 2, result.output
    assert "no-such-mirror: no such directory" in result.output


@pytest.mark.parametrize("source", ["run", "step"])
def test_convert_of_a_run_into_itself_is_refused(
    invoke: Callable[..., Result], run_dir: Path, source: str
) -> None:
    before = [c.step for c in sk.list_checkpoints(run_dir)]
    src = run_dir if source == "run" else run_dir / "step_000000002"
    result = invoke("convert", src, "-o", f"{run_dir}/")
    assert result.exit_code == 2, result.output
    assert "are the same run" in result.output
    assert [c.step for c in sk.list_checkpoints(run_dir)] == before  # no step 0 added


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _arithmetic(invoke: Callable[..., Result], tmp: Path, count: int) -> int:
    """Tensor operations besides allocation run by `statekeeper average` on a safetensors
    file of ``count`` empty tensors and one real one (the foreign-input path)."""
    src = tmp / f"weights{count}.safetensors"
    save_file({**{f"t{i}": torch.empty(0) for i in range(count)}, "w": torch.ones(2)}, str(src))
    with _Ops() as ops:
        result = invoke("average", src, src, "-o", tmp / f"out{count}")
    assert result.exit_code == 0, result.output
    averaged = sk.read(tmp / f"out{count}")
    assert len(averaged) == count + 1 and torch.equal(averaged["w"], torch.ones(2))
    return sum(n for op, n in ops.seen.items() if not op.startswith("aten.empty"))


def test_average_of_empty_tensors_costs_no_arithmetic_per_tensor(
    invoke: Callable[..., Result], tmp_path: Path
) -> None:
    assert _arithmetic(invoke, tmp_path, 100) == _arithmetic(invoke, tmp_path, 300)
