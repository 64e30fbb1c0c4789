"""The extras install together: the caps that torchtitan's own requirements impose on fsspec
and huggingface_hub are spelled out in its extra (so that pip meets them first and picks the
s3fs / gcsfs of that fsspec, instead of backtracking or downgrading under another extra)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

# What the newest datasets below torchtitan 0.3's cap (datasets<4.8, i.e. 4.7.0) requires,
# read from its metadata with pip's resolver (pip install --dry-run --report)
DATASETS_4_7 = {
    "fsspec": SpecifierSet("<=2026.2.0,>=2023.1.0"),
    "huggingface-hub": SpecifierSet("<2.0,>=0.25.0"),
}


def _extra(name: str) -> dict[str, SpecifierSet]:
    reqs = (Requirement(r) for r in EXTRAS[name])
    return {r.name.lower().replace("_", "-"): r.specifier for r in reqs}


def test_torchtitans_datasets_cap_is_the_one_measured() -> None:
    titan = _extra("torchtitan")["torchtitan"]
    installed = importlib.metadata.version("torchtitan")  # scripts/setup installs it
    assert installed in titan
    datasets = next(
        Requirement(r) for r in importlib.metadata.requires("torchtitan") or []
        if re.match(r"datasets\b", r)
    )  # fmt: skip
    assert "4.7.0" in datasets.specifier and "4.8.0" not in datasets.specifier


def test_the_torchtitan_extra_spells_out_the_caps_of_its_dependencies() -> None:
    extra = _extra("torchtitan")
    for name, needed in DATASETS_4_7.items():
        assert name in extra, f"the torchtitan extra lacks the {name} cap {needed}"
        cap = next(s for s in needed if s.operator in ("<", "<="))
        mine = next(s for s in extra[name] if s.operator in ("<", "<="))
        assert mine.operator == cap.operator, name
        assert Version(mine.version) == Version(cap.version), name


def test_the_storage_extras_accept_the_capped_fsspec() -> None:
    capped = "2026.2.0"
    for extra in ("fsspec", "s3", "gcs", "test"):
        for name, spec in _extra(extra).items():
            if name in ("fsspec", "s3fs", "gcsfs"):
                assert spec.contains(capped), (extra, name, spec)
