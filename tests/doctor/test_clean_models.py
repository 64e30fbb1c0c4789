"""Reference models built from torch.nn get no warning or error from any rule."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from statekeeper.doctor.finding import Severity
from statekeeper.doctor.run import run
from statekeeper.testing import assert_checkpoint_safe


def mlp() -> dict[str, Any]:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters()),
            "example_input": torch.randn(3, 8)}  # fmt: skip


def cnn_batchnorm() -> dict[str, Any]:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))  # fmt: skip
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "example_input": torch.randn(2, 3, 8, 8)}  # fmt: skip


def transformer() -> dict[str, Any]:
    model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=32, dropout=0.1, batch_first=True)  # fmt: skip
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters()),
            "example_input": (torch.randn(2, 5, 16), torch.randn(2, 4, 16))}  # fmt: skip


class LSTMTagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 8, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.lstm(x)[0])


def lstm() -> dict[str, Any]:
    model = LSTMTagger()
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters()),
            "example_input": torch.randn(2, 5, 4)}  # fmt: skip


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.block = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)))


def tied_lm() -> dict[str, Any]:
    model = TiedLM()
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters()),
            "example_input": torch.randint(0, 50, (2, 6))}  # fmt: skip


def compiled() -> dict[str, Any]:
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    wrapped = torch.compile(model)
    return {
        "model": wrapped,
        # (typing) a compiled model, typed as a function by torch.compile
        "optimizer": torch.optim.Adam(wrapped.parameters()),  # type: ignore[attr-defined]
        "example_input": None,
    }


CLEAN = [mlp, cnn_batchnorm, transformer, lstm, tied_lm, compiled]


@pytest.mark.parametrize("factory", CLEAN, ids=lambda f: f.__name__)
def test_clean_reference_models_have_no_warning_or_error(factory: Any) -> None:
    report = run(factory)
    bad = [f for f in report.findings if f.severity is not Severity.INFO]
    assert bad == [], bad
    assert report.exit_code == 0
    assert report.skipped == () or factory is compiled  # compiled: no input, forward rules skip


def test_assert_checkpoint_safe_passes_a_clean_model_and_fails_a_hazard() -> None:
    assert_checkpoint_safe(mlp)

    class Grid(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("grid", torch.arange(4.0).expand(3, 4))

    with pytest.raises(AssertionError, match=r"SK001 error .*grid"):
        assert_checkpoint_safe(lambda: Grid())


def test_ties_are_reported_as_information() -> None:
    report = run(tied_lm)
    ties = [f for f in report.findings if f.rule == "SK007"]
    assert ties and all(f.severity is Severity.INFO for f in ties)
    assert any("head.weight" in f.tensor or "embed.weight" in f.tensor for f in ties)
