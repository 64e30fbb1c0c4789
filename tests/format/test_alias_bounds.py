"""Aliases are bounded by the bytes really present (issue #14).

A manifest can be resealed by anyone (its checksum is of its own bytes), so an alias line
can claim any view of a stored base. ``alias_problem`` bounds the view: inside the base,
at most ``MAX_ALIAS_AMPLIFICATION`` times the base's elements; every reader rebuilds
aliases through ``rebuild_alias`` and so refuses a crafted one with a
``CorruptCheckpointError`` naming manifest.json, before any element is touched. Saving keeps
to the same bound, and ``diff`` compares repeated (stride-0) views and tied tensors for the
cost of what is stored. No test here measures time: work is counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import statekeeper as sk
import statekeeper.interop.diff as diff_module
from statekeeper.cli.main import main
from statekeeper.errors import CorruptCheckpointError
from statekeeper.format.aliases import (
    MAX_ALIAS_AMPLIFICATION,
    Alias,
    alias_problem,
    plan_sharing,
    rebuild_alias,
)
from statekeeper.format.manifest import MANIFEST, Manifest
from statekeeper.interop.diff import compare_states

HUGE = Alias("m/a", 0, (2**20, 2**20), (0, 0))  # 2**40 elements over one stored element


def _view_alias(t: torch.Tensor, base: str = "b") -> Alias:
    return Alias(base, t.storage_offset(), tuple(t.shape), t.stride())


# --- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "view",
    [
        lambda b: b,  # tied
        lambda b: b[3:7],  # a slice
        lambda b: b.view(4, 6).t(),  # a transpose
        lambda b: b[:6].expand(4, 6),  # an expand: 24 elements over 24 stored
        lambda b: b.expand(MAX_ALIAS_AMPLIFICATION, 24),  # exactly the bound
        lambda b: b.unfold(0, 8, 1),  # overlapping windows
        lambda b: b[:0],  # no elements
        lambda b: b[5],  # a 0-d view
    ],
)
def test_views_a_state_holds_are_accepted(view: Callable[[torch.Tensor], torch.Tensor]) -> None:
    base = torch.arange(24.0)
    v = view(base)
    alias = _view_alias(v)
    assert alias_problem(alias, base.numel()) is None
    assert torch.equal(rebuild_alias(base, alias), v)


@pytest.mark.parametrize(
    ("alias", "base_numel", "problem"),
    [
        (Alias("b", 0, (2, 3), (1,)), 10, "malformed view"),
        (Alias("b", -1, (2,), (1,)), 10, "malformed view"),
        (Alias("b", 0, (-2,), (1,)), 10, "malformed view"),
        (Alias("b", 0, (2,), (-1,)), 10, "malformed view"),
        (Alias("b", 0, (1,), (2**63,)), 10, "beyond 64 bits"),
        (Alias("b", 0, (0, 2**64), (1, 1)), 10, "beyond 64 bits"),
        (Alias("b", 2**63, (1,), (1,)), 10, "beyond 64 bits"),
        (Alias("b", 9, (2,), (1,)), 10, "reaches past the stored tensor"),
        (Alias("b", 0, (4, 4), (3, 1)), 10, "reaches past the stored tensor"),
        (HUGE, 1, "repeats its base's memory too often"),
        (Alias("b", 0, (MAX_ALIAS_AMPLIFICATION * 10 + 1,), (0,)), 10, "too often"),
        (Alias("b", 0, (2**62,) * 64, (0,) * 64), 1, "too often"),  # no 4000-bit product
    ],
)
def test_bad_views_are_refused(alias: Alias, base_numel: int, problem: str) -> None:
    found = alias_problem(alias, base_numel)
    assert found is not None and problem in found
    with pytest.raises(ValueError, match=f"alias 'x' of '{alias.base}'") as info:
        rebuild_alias(torch.zeros(base_numel), alias, name="x")
    assert problem in str(info.value)


def test_the_bound_is_relative_to_the_base() -> None:
    limit = MAX_ALIAS_AMPLIFICATION * 100
    assert alias_problem(Alias("b", 0, (limit,), (0,)), 100) is None
    assert alias_problem(Alias("b", 0, (limit + 1,), (0,)), 100) is not None
    assert alias_problem(Alias("b", 0, (2, limit // 2), (0, 0)), 100) is None
    assert alias_problem(Alias("b", 0, (0, 2**62), (0, 0)), 1) is None  # empty: no work


# --- saving keeps to the bound -------------------------------------------------------------


def test_save_aliases_views_within_the_bound_and_stores_the_others(tmp_path: Path) -> None:
    base = torch.arange(10.0)
    state = {
        "a": base,
        "near": base.expand(MAX_ALIAS_AMPLIFICATION, 10),  # aliased: at the bound
        "far": base[:1].expand(MAX_ALIAS_AMPLIFICATION * 10 + 1),  # stored with its values
        "slice": base[2:5],
    }
    plan = plan_sharing(state)
    assert set(plan.aliases) == {"near", "slice"} and list(plan.stored) == ["a", "far"]
    sk.save(tmp_path, {"m": state}, step=1)
    loaded = sk.read(tmp_path)["m"]
    for name, value in state.items():
        assert torch.equal(loaded[name], value), name
    assert loaded["near"].data_ptr() == loaded["a"].data_ptr()  # still shared
    assert loaded["far"].data_ptr() != loaded["a"].data_ptr()  # equal values, own memory


def test_a_group_shrinks_until_every_alias_is_within_the_bound(tmp_path: Path) -> None:
    storage = torch.arange(100.0)
    state = {
        "wide": storage.as_strided((2, 6401), (99, 0)),  # spans 100, repeats it 128x: alone
        "rep": storage[:1].expand(200),  # 2x the 100 of the first span, 100x the 2 left
        "head": storage[:2],
        "tail": storage[1:2],
    }
    plan = plan_sharing(state)
    assert list(plan.stored) == ["wide", "rep", "head"] and list(plan.aliases) == ["tail"]
    assert alias_problem(plan.aliases["tail"], 2) is None
    sk.save(tmp_path, state, step=1)
    loaded = sk.read(tmp_path)
    for name, value in state.items():
        assert torch.equal(loaded[name], value), name


# --- every reader refuses a crafted alias --------------------------------------------------


@pytest.fixture
def crafted(tmp_path: Path) -> Path:
    """A run whose step has an honest alias replaced by HUGE, the manifest resealed."""
    base = torch.arange(4.0)
    sk.save(tmp_path / "run", {"m": {"a": base, "b": base[1:3]}}, step=1)
    path = tmp_path / "run" / "step_000000001" / MANIFEST
    manifest = Manifest.from_bytes(MANIFEST, path.read_bytes())
    assert set(manifest.aliases) == {"m/b"}
    path.write_bytes(dataclasses.replace(manifest, aliases={"m/b": HUGE}).to_bytes())
    return tmp_path / "run"


def _refused(error: BaseException | str) -> None:
    text = str(error)
    assert MANIFEST in text and "'m/a'" in text and "[1048576, 1048576]" in text, text
    assert "too often" in text


def test_read_refuses(crafted: Path) -> None:
    with pytest.raises(CorruptCheckpointError) as info:
        sk.read(crafted)
    assert info.value.path.endswith(MANIFEST)
    _refused(info.value)


@pytest.mark.parametrize(
    "call",
    [
        lambda run, out: sk.audit.diff(run, run),
        lambda run, out: sk.conversion.convert(run, out / "flat.safetensors"),
        lambda run, out: sk.conversion.export(run, out / "weights.safetensors"),
    ],
    ids=["diff", "convert", "export"],
)
def test_api_readers_refuse(crafted: Path, tmp_path: Path, call: Callable[..., Any]) -> None:
    with pytest.raises(CorruptCheckpointError) as info:
        call(crafted, tmp_path)
    _refused(info.value)
    assert not list(tmp_path.glob("*.safetensors"))


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "{run}"],
        ["diff", "{run}", "{run}"],
        ["convert", "{run}", "-o", "{out}/flat.safetensors"],
        ["export", "{run}", "-o", "{out}/weights.safetensors"],
    ],
    ids=lambda a: a[0],
)
def test_cli_readers_refuse(crafted: Path, tmp_path: Path, args: list[str]) -> None:
    argv = [a.format(run=crafted, out=tmp_path) for a in args]
    result = CliRunner(env={"COLUMNS": "400"}).invoke(main, argv)
    assert result.exit_code == 1, result.output
    _refused(result.output)


# --- diff pays for what is stored ----------------------------------------------------------


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Elements ``diff`` reads: the sizes handed to its bitwise comparison."""
    seen: list[int] = []
    original = diff_module._identical

    def counted(a: torch.Tensor, b: torch.Tensor) -> bool:
        seen.append(a.numel())
        return original(a, b)

    monkeypatch.setattr(diff_module, "_identical", counted)
    return seen


def test_diff_of_repeated_views_reads_the_stored_part(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _counting(monkeypatch)
    a, b = torch.arange(1000.0), torch.arange(1000.0)
    result = compare_states({"x": a.expand(64, 1000)}, {"x": b.expand(64, 1000)})
    assert result.equal and seen == [1000]


def test_diff_of_tied_tensors_compares_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _counting(monkeypatch)
    a, b = torch.arange(50.0), torch.arange(50.0)
    names = [f"layer{i}.weight" for i in range(20)]
    result = compare_states(dict.fromkeys(names, a), dict.fromkeys(names, b))
    assert result.equal and sorted(result.equal_tensors) == sorted(names)
    assert seen == [50]


def test_diff_of_the_same_view_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _counting(monkeypatch)
    t = torch.tensor([1.0, float("nan")])
    result = compare_states({"x": t}, {"x": t})
    assert result.equal and seen == []


def test_diff_tells_a_conjugate_view_from_its_memory() -> None:
    t = torch.tensor([1 + 2j, 3 - 1j])
    (found,) = compare_states({"x": t}, {"x": t.conj()}).different
    assert found.max_abs == 4.0


@pytest.mark.parametrize(("atol", "rtol"), [(0.0, 0.0), (0.5, 0.0), (0.0, 0.01)])
def test_diff_results_match_materialized_copies(atol: float, rtol: float) -> None:
    torch.manual_seed(0)
    base_a = torch.randn(3, 1, 5)
    base_b = base_a.clone()
    base_b[1, 0, 2] += 0.25
    base_b[2, 0, 4] = float("nan")
    base_a[0, 0, 0] = base_b[0, 0, 0] = float("nan")
    views = {
        "expanded": lambda t: t.expand(3, 7, 5),
        "mixed": lambda t: t.expand(3, 7, 5)[:, :, ::2],
        "plain": lambda t: t,
    }
    repeated = compare_states(
        {k: f(base_a) for k, f in views.items()},
        {k: f(base_b) for k, f in views.items()},
        atol=atol,
        rtol=rtol,
    )
    dense = compare_states(
        {k: f(base_a).contiguous() for k, f in views.items()},
        {k: f(base_b).contiguous() for k, f in views.items()},
        atol=atol,
        rtol=rtol,
    )
    assert repeated == dense


def test_diff_of_one_side_repeated_still_compares_every_element() -> None:
    a = torch.zeros(4).expand(3, 4)
    b = torch.zeros(3, 4)
    b[2, 1] = 1.0
    (found,) = compare_states({"x": a}, {"x": b}).different
    assert found.max_abs == 1.0 and found.shape == (3, 4)


def test_the_manifest_bounds_aliases_before_any_reader_runs(tmp_path: Path) -> None:
    """A crafted alias is refused by the manifest parser itself, so even inspect (which reads
    only the manifest) refuses it; tied weights named many times still load."""
    import dataclasses

    from tests.helpers.hostile import rewrite_manifest

    from statekeeper.format.manifest import Manifest

    weight = torch.ones(4, 4)
    tied = {f"t{i}": weight for i in range(200)}  # 199 aliases of one view: 199x the base
    sk.save(tmp_path / "tied", tied, step=1)
    assert len(sk.read(tmp_path / "tied")) == 200
    step = tmp_path / "tied" / "step_000000001"

    def amplify(text: str) -> str:
        manifest = Manifest.from_bytes("m", text.encode())
        name = next(iter(manifest.aliases))
        bad = dataclasses.replace(manifest.aliases[name], shape=(2**20, 2**20), stride=(0, 0))
        return (
            dataclasses.replace(manifest, aliases={**manifest.aliases, name: bad})
            .to_bytes()
            .decode()
        )

    rewrite_manifest(step, amplify)
    with pytest.raises(sk.CorruptCheckpointError, match="repeats its base's memory too often"):
        Manifest.from_bytes(str(step / "manifest.json"), (step / "manifest.json").read_bytes())
