"""SK007 (shared storage, wrapper prefixes), SK008 (pickle-only values), SK009 (mode-dependent
state), and the doctor on checkpoint files: each with a model that triggers it and one that
does not."""

from __future__ import annotations

import random
import zipfile
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import safetensors.torch
import torch
from torch import nn

import statekeeper as sk
from statekeeper.doctor.checkpoint_rules import check_checkpoint
from statekeeper.doctor.finding import Finding, Severity
from statekeeper.doctor.rules.mode_dependent import ModeDependent
from statekeeper.doctor.rules.pickle_values import PickleValues
from statekeeper.doctor.rules.shared_storage import SharedStorage
from statekeeper.doctor.run import run
from statekeeper.doctor.target import build_target


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 4)
        self.head = nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.embed(x))
        return out


class Wrapper(nn.Module):
    """What DataParallel/DDP look like to state_dict(): the model under ``module``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.module = inner


class Tokenizer:
    def __init__(self) -> None:
        self.vocab = {"a": 1}


class WithExtraState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)

    def get_extra_state(self) -> Any:
        return {"tokenizer": Tokenizer(), "version": 3, "names": ["a", Tokenizer()]}

    def set_extra_state(self, state: Any) -> None:
        pass


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = WithExtraState()
        self.register_buffer("phase", torch.zeros(3, dtype=torch.complex128))


class EvalCache(nn.Module):
    """Registers a persistent cache in eval() and deletes it in train()."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def train(self, mode: bool = True) -> EvalCache:
        super().train(mode)
        if mode:
            self._buffers.pop("cache", None)
        else:
            self.register_buffer("cache", self.proj.weight.detach().t().clone())
        return self


class LazyCache(nn.Module):
    """Builds a persistent cache in its first eval forward; train() resets a counter."""

    evals: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.register_buffer("evals", torch.zeros((), dtype=torch.long))

    def train(self, mode: bool = True) -> LazyCache:
        super().train(mode)
        if mode:
            self._buffers.pop("kv", None)
            self.evals.zero_()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            self.register_buffer("kv", x.clone())
            self.evals += 1
        out: torch.Tensor = self.proj(x)
        return out


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def mlp_with_input() -> dict[str, Any]:
    model = mlp()
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters()),
        "example_input": torch.randn(5, 4),
    }


def tied_lm() -> nn.Module:
    return TiedLM()


def compiled_lm() -> nn.Module:
    return cast(nn.Module, torch.compile(TiedLM()))


def wrapped_mlp() -> nn.Module:
    return Wrapper(mlp())


def with_extra_state() -> dict[str, Any]:
    model = Nested()
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}


def eval_cache() -> nn.Module:
    return EvalCache()


def lazy_cache() -> dict[str, Any]:
    return {"model": LazyCache(), "example_input": torch.randn(2, 3)}


def _findings(factory: Any, rule: Any) -> list[Finding]:
    report = run(factory, rules=(rule,))
    assert report.skipped == ()
    return list(report.findings)


# SK007


def test_sk007_tied_weights_are_info_only() -> None:
    (finding,) = _findings(tied_lm, SharedStorage())
    assert (finding.rule, finding.severity) == ("SK007", Severity.INFO)
    assert (finding.where, finding.tensor) == ("head", "head.weight")
    assert finding.shape == (11, 4) and finding.bytes == 11 * 4 * 4
    assert "shares storage with embed.weight" in finding.problem
    assert "re-ties" in finding.fix


def test_sk007_outer_torch_compile_prefix_is_information() -> None:
    findings = _findings(compiled_lm, SharedStorage())
    assert [f for f in findings if f.severity is Severity.WARNING] == []  # statekeeper unwraps it
    prefixes = [f for f in findings if f.where == "_orig_mod"]
    assert len(prefixes) == 1 and prefixes[0].severity is Severity.INFO
    assert "2 state_dict keys start with '_orig_mod.'" in prefixes[0].problem
    assert "model._orig_mod" in prefixes[0].fix
    ties = [f.tensor for f in findings if f.severity is Severity.INFO and f.where != "_orig_mod"]
    assert ties == ["head.weight"]  # as statekeeper.save names it


def test_sk007_module_prefix() -> None:
    (finding,) = _findings(wrapped_mlp, SharedStorage())
    assert finding.severity is Severity.WARNING and finding.where == "module"
    assert "9 state_dict keys start with 'module.'" in finding.problem
    assert "model.module" in finding.fix


def test_sk007_clean() -> None:
    assert _findings(mlp, SharedStorage()) == []


# SK008


def test_sk008_reports_every_offending_key() -> None:
    findings = _findings(with_extra_state, PickleValues())
    assert {f.severity for f in findings} == {Severity.ERROR}
    got = {(f.where, f.tensor) for f in findings}
    assert got == {
        ("block", "block._extra_state/tokenizer"),
        ("block", "block._extra_state/names/1"),
        ("<root>", "phase"),
    }
    by_tensor = {f.tensor: f for f in findings}
    tokenizer = by_tensor["block._extra_state/tokenizer"]
    assert f"{__name__}.Tokenizer" in tokenizer.problem and "get_extra_state" in tokenizer.problem
    assert "get_extra_state" in tokenizer.fix
    phase = by_tensor["phase"]
    assert "complex128" in phase.problem and phase.shape == (3,) and phase.bytes == 48


def test_sk008_clean_model_and_optimizer() -> None:
    assert _findings(mlp_with_input, PickleValues()) == []


# SK009


def test_sk009_key_registered_in_eval() -> None:
    (finding,) = _findings(eval_cache, ModeDependent())
    assert (finding.rule, finding.severity) == ("SK009", Severity.ERROR)
    assert (finding.where, finding.tensor) == ("<root>", "cache")
    assert "appears when train() is followed by eval()" in finding.problem
    assert "persistent=False" in finding.fix


def test_sk009_cache_built_in_eval_forward() -> None:
    findings = _findings(lazy_cache, ModeDependent())
    assert [(f.tensor, f.problem.split(" when ")[0]) for f in findings] == [
        ("kv", "'kv' vanishes"),
        ("evals", "'evals' changes value"),
    ]


def test_sk009_clean_and_restores_state() -> None:
    target = build_target(mlp_with_input)
    assert target.model is not None
    target.model.eval()
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    report = run(target, rules=(ModeDependent(),))
    assert report.findings == () and report.skipped == ()
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(1), expected[2])
    assert not target.model.training  # the target's own model is untouched


def test_sk009_needs_a_factory() -> None:
    report = run(mlp(), rules=(ModeDependent(),))
    assert report.findings == ()
    assert [(rule, reason.split(":")[0]) for rule, reason in report.skipped] == [
        ("SK009", "needs a factory that builds fresh instances")
    ]


# checkpoints on disk


def test_checkpoint_saved_from_compiled_model(tmp_path: Path) -> None:
    compiled = compiled_lm()
    # statekeeper.save unwraps the compiled model; a raw state_dict() keeps the prefix
    weights = compiled_lm().state_dict()
    sk.save(tmp_path, {"model": compiled, "weights": weights}, step=1)
    report = check_checkpoint(str(tmp_path))
    (warning,) = report.by_severity(Severity.WARNING)
    assert (warning.rule, warning.where) == ("SK007", "weights")
    assert "2 tensor names start with '_orig_mod.'" in warning.problem
    assert "_orig_mod" in warning.fix
    infos = report.by_severity(Severity.INFO)
    assert [f.tensor for f in infos] == ["model/head.weight", "weights/_orig_mod.head.weight"]
    assert all("re-tied on load" in f.problem for f in infos)
    assert infos[0].shape == (11, 4) and infos[0].bytes == 176
    assert report.exit_code == 1
    assert check_checkpoint(str(tmp_path / "step_000000001")).findings == report.findings


def test_clean_checkpoint(tmp_path: Path) -> None:
    sk.save(tmp_path, {"model": mlp()}, step=3)
    report = check_checkpoint(str(tmp_path))
    assert report.findings == () and report.exit_code == 0


def _never(*args: object, **kwargs: object) -> None:
    raise AssertionError("the doctor must never unpickle a file")


class Config:
    """A class a checkpoint pickles whole: weights_only loading refuses it."""


def test_torch_save_of_a_state_dict_gets_inspect_s_safe_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.pt"
    torch.save(mlp().state_dict(), path)
    assert zipfile.is_zipfile(path)
    inspected = sk.read(path)  # inspect and read open it with weights_only=True
    assert set(inspected) == set(mlp().state_dict())
    monkeypatch.setattr(torch, "load", _never)
    report = check_checkpoint(str(path))
    (finding,) = report.findings
    assert (finding.rule, finding.severity, finding.where) == ("SK008", Severity.INFO, "w.pt")
    assert "weights_only=True opens it without running code" in finding.problem
    assert report.exit_code == 0


def test_torch_save_file_that_needs_more_than_weights_only_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.pt"
    torch.save({"w": torch.ones(2), "config": Config()}, path)
    with pytest.raises(sk.errors.UnsafePickleError):
        sk.read(path)
    monkeypatch.setattr(torch, "load", _never)
    report = check_checkpoint(str(path))
    (finding,) = report.findings
    assert (finding.rule, finding.severity, finding.where) == ("SK008", Severity.ERROR, "w.pt")
    assert finding.problem.startswith("this file is a pickle that weights_only loading refuses")
    assert "test_rules_sk007_009.Config" in finding.problem
    assert "statekeeper.save" in finding.fix
    assert report.exit_code == 2


def test_legacy_torch_save_file_is_scanned_too(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    (finding,) = check_checkpoint(str(path)).findings
    assert finding.severity is Severity.INFO and "pickle protocol" in finding.problem
    torch.save({"c": Config()}, path, _use_new_zipfile_serialization=False)
    (finding,) = check_checkpoint(str(path)).findings
    assert finding.severity is Severity.ERROR and "pickle protocol" in finding.problem


def test_safetensors_file(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in mlp().state_dict().items()}, path)
    report = check_checkpoint(str(path))
    (finding,) = report.findings
    assert (finding.rule, finding.severity) == ("SK008", Severity.INFO)
    assert finding.problem.startswith("safe format")
    assert report.exit_code == 0


def test_safetensors_file_with_module_prefix(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    state = {f"module.{k}": v for k, v in mlp().state_dict().items()}
    safetensors.torch.save_file(state, path)
    warnings = check_checkpoint(str(path)).by_severity(Severity.WARNING)
    assert [(f.rule, f.where) for f in warnings] == [("SK007", "w.safetensors")]
    assert "'module.'" in warnings[0].problem


def test_foreign_directory(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin")
    torch.save({"c": Config()}, tmp_path / "training_args.bin")
    safetensors.torch.save_file({"w": torch.ones(2)}, tmp_path / "model.safetensors")
    report = check_checkpoint(str(tmp_path))
    assert [(f.where, f.severity) for f in report.findings] == [
        ("model.safetensors", Severity.INFO),
        ("pytorch_model.bin", Severity.INFO),
        ("training_args.bin", Severity.ERROR),
    ]


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(sk.StepNotFoundError):
        check_checkpoint(str(tmp_path / "nope"))
    with pytest.raises(sk.StepNotFoundError):
        check_checkpoint(str(tmp_path))  # empty: no step and no checkpoint files
