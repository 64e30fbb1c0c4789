"""Bitwise resume after SIGKILL, for the families of runs users train."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.checkpoint import resume_runs as runs

from statekeeper.testing import Run, assert_resumes_exactly

STEPS = 7
STOPS = (1, 4, STEPS)  # first step, mid-run, last step

FAMILIES = [
    runs.mlp_sgd_momentum,
    runs.cnn_batchnorm_adam_steplr,
    runs.transformer_dropout_adamw_warmup_cosine,
    runs.autocast_gradscaler,
    runs.set_order_adam,
    runs.mlp_with_ema,
]


@pytest.mark.parametrize("make_run", FAMILIES, ids=lambda f: f.__name__)
def test_family_resumes_bitwise_after_sigkill(make_run: Callable[[], Run]) -> None:
    assert_resumes_exactly(make_run, steps=STEPS, stop_at=STOPS)


@pytest.mark.parametrize(
    "make_run", [runs.loader_shuffle, runs.loader_shuffle_two_workers], ids=lambda f: f.__name__
)
def test_stateful_dataloader_resumes_mid_epoch_and_across_epochs(
    make_run: Callable[[], Run],
) -> None:
    # 9 batches an epoch: stop mid-epoch 1, at the epoch boundary, mid-epoch 2
    assert_resumes_exactly(make_run, steps=20, stop_at=(5, 9, 14))


def test_harness_names_the_forgotten_scheduler() -> None:
    with pytest.raises(AssertionError, match=r"killed after step 3 .* first difference at model/"):
        assert_resumes_exactly(runs.cnn_forgets_scheduler, steps=STEPS, stop_at=3)


def test_harness_names_the_forgotten_generator() -> None:
    with pytest.raises(AssertionError, match=r"first difference at (model|opt)/"):
        assert_resumes_exactly(runs.mlp_forgets_generator, steps=STEPS, stop_at=2)


def test_harness_refuses_local_functions() -> None:
    def local() -> Run:
        return runs.mlp_sgd_momentum()

    with pytest.raises(ValueError, match="module-level"):
        assert_resumes_exactly(local, steps=2, stop_at=1)
