"""The loader rules: each has a state that triggers it and one that does not."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler as TorchdataRandomSampler

import statekeeper as sk
from statekeeper.doctor.run import run

DATA = list(range(10))


class Noisy(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(2) + i


def _rules(state: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f.rule, f.where) for f in run(state).findings]


def _resumable(dataset: Any = DATA, workers: int = 0) -> sk.data.ResumableLoader:
    sampler = sk.data.ResumableSampler(dataset, seed=1)
    return sk.data.ResumableLoader(
        torch.utils.data.DataLoader(dataset, sampler=sampler, num_workers=workers)
    )


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({"loader": torch.utils.data.DataLoader(DATA)}, [("SK010", "loader")]),
        (
            {"loader": torch.utils.data.DataLoader(DATA, sampler=sk.data.ResumableSampler(DATA))},
            [("SK010", "loader")],
        ),
        (
            {"loader": StatefulDataLoader(DATA, sampler=torch.utils.data.RandomSampler(DATA))},
            [("SK010", "loader")],
        ),
        ({"loader": _resumable()}, []),
        ({"loader": StatefulDataLoader(DATA, sampler=sk.data.ResumableSampler(DATA))}, []),
        (
            {"loader": StatefulDataLoader(DATA, shuffle=True, generator=torch.Generator())},
            [("SK011", "loader")],
        ),
        (
            {
                "loader": StatefulDataLoader(
                    DATA, shuffle=True, generator=torch.Generator().manual_seed(3)
                )
            },
            [],
        ),
        (
            {
                "loader": StatefulDataLoader(
                    DATA, sampler=TorchdataRandomSampler(DATA, generator=torch.Generator())
                )
            },
            [("SK011", "loader")],
        ),
        ({"data": _resumable(Noisy(), workers=2)}, [("SK012", "data")]),
        ({"data": _resumable(Noisy(), workers=0)}, []),
        ({"data": _resumable(sk.data.SeededDataset(Noisy(), seed=1), workers=2)}, []),
        ({"data": _resumable(DATA, workers=2)}, []),
    ],
    ids=[
        "plain-dataloader", "plain-with-resumable-sampler", "torch-random-sampler",
        "resumable-loader", "stateful-resumable", "unseeded-generator", "seeded-generator",
        "unseeded-sampler-generator", "augmenting-workers", "augmenting-main-process",
        "seeded-dataset", "deterministic-workers",
    ],
)  # fmt: skip
def test_loader_rules(state: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    assert _rules(state) == expected


def test_findings_name_the_fix_and_leave_the_rng_alone() -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()
    findings = run({"data": _resumable(Noisy(), workers=2)}).findings
    assert torch.equal(torch.get_rng_state(), before)
    assert "SeededDataset" in findings[0].fix
    assert findings[0].severity == "error"


def test_a_model_factory_is_accepted() -> None:
    assert run(lambda: torch.nn.Linear(2, 2)).findings == ()
    with pytest.raises(sk.errors.InvalidArgumentError, match=r"nn.Module or a dict"):
        run(lambda: 3)
