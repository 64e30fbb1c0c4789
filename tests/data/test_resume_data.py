"""A training run over an augmenting dataset resumes bitwise, across epoch boundaries."""

from __future__ import annotations

from tests.checkpoint import resume_runs as runs

from statekeeper.testing import assert_resumes_exactly


def test_augmenting_plain_dataloader_run_resumes_across_two_epoch_boundaries() -> None:
    # 6 batches an epoch: resumed after step 5, the run crosses epochs at 6, 12 and 18
    assert_resumes_exactly(runs.resumable_loader_augmenting, steps=20, stop_at=5)
