"""diff treats a key that a Hugging Face folder omits because it is tied as equal."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tests.helpers.stock_models import gpt2_model

import statekeeper as sk
from statekeeper.cli.main import main


@pytest.fixture
def gpt2_two_ways(tmp_path: Path) -> tuple[Path, Path]:
    torch.manual_seed(0)
    model = gpt2_model()
    folder = tmp_path / "hf"
    model.save_pretrained(folder)  # stores wte once: no lm_head.weight
    pt = tmp_path / "model.pt"
    torch.save(model.state_dict(), pt)  # both keys, sharing memory
    return folder, pt


def test_a_tied_key_the_folder_omits_is_equal_by_default(gpt2_two_ways: tuple[Path, Path]) -> None:
    folder, pt = gpt2_two_ways
    assert "lm_head.weight" not in sk.read(folder)
    result = sk.audit.diff(folder, pt)
    assert result.equal, result.to_json()
    assert any("lm_head.weight: only in" in n and "tied to transformer.wte.weight" in n
               for n in result.notes)  # fmt: skip
    strict = sk.audit.diff(folder, pt, tied=sk.audit.TiedKeys.STRICT)
    assert not strict.equal and strict.only_b == ("lm_head.weight",)


def test_a_different_twin_still_differs(gpt2_two_ways: tuple[Path, Path], tmp_path: Path) -> None:
    folder, pt = gpt2_two_ways
    state = torch.load(pt, weights_only=True)
    state["transformer.wte.weight"][0, 0] += 1  # the tie survives torch.load: both change
    changed = tmp_path / "changed.pt"
    torch.save(state, changed)
    result = sk.audit.diff(folder, changed)
    assert not result.equal
    assert [d.key for d in result.different] == ["transformer.wte.weight"]


def test_two_plain_files_stay_strict_unless_asked(tmp_path: Path) -> None:
    w = torch.ones(2, 2)
    torch.save({"a": w, "b": w}, tmp_path / "both.pt")
    torch.save({"a": w.clone()}, tmp_path / "one.pt")
    assert not sk.audit.diff(tmp_path / "both.pt", tmp_path / "one.pt").equal
    assert sk.audit.diff(
        tmp_path / "both.pt", tmp_path / "one.pt", tied=sk.audit.TiedKeys.MATCH
    ).equal
    cli = CliRunner().invoke(main, ["diff", str(tmp_path / "both.pt"), str(tmp_path / "one.pt"),
                                    "--tied", "match"])  # fmt: skip
    assert cli.exit_code == 0, cli.output
