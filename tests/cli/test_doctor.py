"""statekeeper doctor MODULE:FUNCTION, human and --json."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from statekeeper.cli.main import main


def bad_state() -> dict[str, Any]:
    return {"model": torch.nn.Linear(2, 2), "loader": torch.utils.data.DataLoader(range(4))}


def good_model() -> torch.nn.Module:
    return torch.nn.Linear(2, 2)


def test_doctor_reports_findings_with_exit_2_for_errors() -> None:
    result = CliRunner().invoke(main, ["doctor", f"{__name__}:bad_state"])
    assert result.exit_code == 2, result.output
    assert "SK010 error loader" in " ".join(result.output.split())
    assert "ResumableLoader" in result.output


def test_doctor_json_and_clean_exit() -> None:
    result = CliRunner().invoke(main, ["doctor", f"{__name__}:good_model", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["findings"] == []
    assert {r["id"] for r in data["rules"]} >= {"SK010", "SK011", "SK012"}


def test_doctor_bad_factory_exits_3() -> None:
    for spec in ["nocolon", "no_such_module_xyz:f", f"{__name__}:missing"]:
        result = CliRunner().invoke(main, ["doctor", spec])
        assert result.exit_code == 3, (spec, result.output)


def test_doctor_on_checkpoints(tmp_path: Path) -> None:
    import statekeeper as sk

    sk.save(tmp_path / "run", {"model": torch.nn.Linear(2, 2)}, step=1)
    clean = CliRunner().invoke(main, ["doctor", str(tmp_path / "run"), "--json"])
    assert clean.exit_code == 0, clean.output
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights.pt")
    pickled = CliRunner().invoke(main, ["doctor", str(tmp_path / "weights.pt")])
    assert pickled.exit_code == 0, pickled.output  # weights_only opens it, as inspect does
    assert "SK008" in pickled.output and "weights_only" in pickled.output
    torch.save({"w": torch.zeros(2), "why": ValueError("x")}, tmp_path / "unsafe.pt")
    unsafe = CliRunner().invoke(main, ["doctor", str(tmp_path / "unsafe.pt")])
    assert unsafe.exit_code == 2, unsafe.output
    assert "SK008" in unsafe.output and "builtins.ValueError" in unsafe.output


class Grid(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("grid", torch.arange(4.0).expand(3, 4))
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x + self.grid.sum())


def hazardous_model() -> dict[str, Any]:
    return {"model": Grid(), "example_input": torch.randn(2, 4)}


def test_doctor_reports_a_model_hazard_with_the_tensor_and_fix() -> None:
    result = CliRunner().invoke(main, ["doctor", f"{__name__}:hazardous_model"])
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert "SK001 error" in flat and "grid" in flat and "fix:" in flat
    data = json.loads(
        CliRunner().invoke(main, ["doctor", f"{__name__}:hazardous_model", "--json"]).output
    )
    assert data["exit_code"] == 2
    assert any(f["rule"] == "SK001" and f["tensor"] == "grid" for f in data["findings"])


def test_python_api_is_statekeeper_doctor_run() -> None:
    import statekeeper.doctor
    from statekeeper.doctor.run import run

    assert statekeeper.doctor.run is run
    assert statekeeper.doctor.Report is type(run(torch.nn.Linear(2, 2)))


def test_report_prints_user_text_literally(capsys: pytest.CaptureFixture[str]) -> None:
    from statekeeper.cli import render_doctor
    from statekeeper.doctor.finding import Finding, Report, Severity

    finding = Finding("SK004", Severity.WARNING, "[bold]blocks", "cache[0] at :llama:", "fix it")
    report = Report("models:llama", (finding,), (("SK004", "x"), ("SK006", "y")),
                    (("SK006", "needs an example input: return ..."),), 0.5)  # fmt: skip
    render_doctor.doctor_report(report, as_json=False)
    out = capsys.readouterr().out
    assert "models:llama" in out and "[bold]blocks" in out and "cache[0] at :llama:" in out
    assert "1 of 2 rules skipped" in out


class _Cache(torch.nn.Module):
    statekeeper_transient = ("hidden",)  # already declared: kept, not proposed again

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("membrane", torch.zeros(1, 4))
        self.hidden: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.hidden = self.fc(x)
        self.last_input = x * 1.0
        self.membrane = self.membrane * 0.5 + self.hidden.detach()
        return self.hidden


class _Tap(torch.nn.Module):
    """Identity-like: keeps its input, which is the caller's (to be dropped, never emptied)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = x
        return x


class _Observer(torch.nn.Module):
    """Stands for a class of torch's own (not the user's to edit)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = x + 1
        return x


_Observer.__module__ = "torch.ao.fake"


def transient_model() -> dict[str, Any]:
    model = torch.nn.Sequential(_Cache(), _Cache(), _Tap(), _Observer())
    return {"model": model, "example_input": torch.ones(3, 4)}


def test_fix_transient_prints_the_declarations_to_add_and_they_work() -> None:
    result = CliRunner().invoke(main, ["doctor", f"{__name__}:transient_model", "--fix-transient"])
    assert result.exit_code == 1, result.output
    assert "class _Cache(...):" in result.output and "at model.0, model.1" in result.output
    assert "class _Tap(...):" in result.output
    assert "    statekeeper_borrowed = ('seen',)" in result.output  # the caller's input
    assert "_Observer is torch.ao.fake._Observer, not yours to edit" in result.output
    assert "\n_Observer.statekeeper_transient = ('last',)" in result.output
    assert "statekeeper_transient = ('hidden', 'last_input')" in result.output
    assert "statekeeper_batch_state = ('membrane',)" in result.output
    assert (
        "include=statekeeper.clearing.ClearInclude.BATCH_STATE, like=fresh_model" in result.output
    )
    data = json.loads(
        CliRunner()
        .invoke(main, ["doctor", f"{__name__}:transient_model", "--fix-transient", "--json"])
        .output
    )
    fix, tap, observer = data["classes"]
    assert fix["class"].endswith("._Cache") and fix["added"] == ["last_input", "membrane"]
    assert tap["borrowed"] == ["seen"] and tap["transient"] == [] and not tap["library"]
    assert observer["library"] and observer["source"] is None
    line = inspect.getsourcelines(_Cache)[1]
    assert fix["source"] == f"{inspect.getsourcefile(_Cache)}:{line}"

    class Declared(_Cache):  # what the doctor proposed, applied: clear_state frees it all
        # (typing) a test model with its own transient names
        statekeeper_transient = ("hidden", "last_input")  # type: ignore[assignment]
        statekeeper_batch_state = ("membrane",)

    import statekeeper as sk

    model = Declared()
    with torch.no_grad():
        model(torch.ones(3, 4))
    sk.clearing.clear_state(model, include=sk.clearing.ClearInclude.BATCH_STATE, like=Declared())
    assert model.hidden is None and not hasattr(model, "last_input")  # __init__ made none
    assert torch.equal(model.membrane, torch.zeros(1, 4))  # as __init__ made it


class _Wrapper(torch.nn.Module):
    """Hugging Face style: the inner network is a submodule called "model"."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Linear(4, 4)
        self.last_logits: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last_logits = self.model(x)
        return self.last_logits


def wrapper_model() -> dict[str, Any]:
    return {"model": _Wrapper(), "example_input": torch.ones(2, 4)}


def clean_model() -> dict[str, Any]:
    return {"model": torch.nn.Linear(2, 2), "example_input": torch.ones(1, 2)}


def test_fix_transient_names_the_root_class_and_says_when_nothing_was_checked(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(main, ["doctor", f"{__name__}:wrapper_model", "--fix-transient"])
    assert result.exit_code == 1 and "class _Wrapper(...):" in result.output
    assert "statekeeper_transient = ('last_logits',)" in result.output
    clean = CliRunner().invoke(main, ["doctor", f"{__name__}:clean_model", "--fix-transient"])
    assert clean.exit_code == 0 and "no transient tensors" in clean.output
    unchecked = CliRunner().invoke(main, ["doctor", f"{__name__}:good_model", "--fix-transient"])
    assert unchecked.exit_code == 3 and "not checked" in unchecked.output
    assert "SK004 skipped: needs an example input" in unchecked.output
    path = tmp_path / "weights.pt"
    path.write_bytes(b"")
    result = CliRunner().invoke(main, ["doctor", str(path), "--fix-transient"])
    assert result.exit_code == 3 and "reads a model, not a checkpoint" in result.output


class _Calibrating(torch.nn.Module):
    """An observer-like buffer (empty, then filled) and a scripted submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("min_val", torch.tensor([]))
        self.scripted = torch.jit.script(torch.nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.min_val = x.min(0).values
        self.seen = x
        return self.scripted(x)


def calibrating_model() -> dict[str, Any]:
    return {"model": _Calibrating(), "example_input": torch.ones(3, 4)}


def test_fix_transient_leaves_calibration_alone_and_copes_with_torchscript() -> None:
    result = CliRunner().invoke(
        main, ["doctor", f"{__name__}:calibrating_model", "--fix-transient", "--json"]
    )
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    (fix,) = data["classes"]
    assert fix["borrowed"] == ["seen"] and fix["batch_state"] == []
    assert data["not_proposed"] == ["min_val of _Calibrating"]


def observed_model() -> dict[str, Any]:
    from torch.ao.quantization import MinMaxObserver

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), MinMaxObserver())
    return {"model": model, "example_input": torch.randn(3, 4)}


def test_fix_transient_never_proposes_an_observers_calibration() -> None:
    result = CliRunner().invoke(
        main, ["doctor", f"{__name__}:observed_model", "--fix-transient", "--json"]
    )
    data = json.loads(result.output)
    assert result.exit_code == 0, result.output
    assert data["classes"] == [] and data["not_proposed"] == [
        "min_val of MinMaxObserver", "max_val of MinMaxObserver"
    ]  # fmt: skip
