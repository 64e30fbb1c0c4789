"""The integration modules stay one concept each, under the project's ~300-line cap (split
rather than grow: transformers.py's save and resume hooks live in hf_save / hf_restore)."""

from __future__ import annotations

from pathlib import Path

import statekeeper.integrations

CAP = 300


def test_every_integration_module_is_under_the_line_cap() -> None:
    folder = Path(statekeeper.integrations.__file__).parent
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(folder.glob("*.py"))}
    assert {name: n for name, n in sizes.items() if n > CAP} == {}


def test_the_trainer_mixin_still_overrides_the_trainers_hooks() -> None:
    from transformers import Trainer

    from statekeeper.integrations.transformers import StatekeeperTrainer, StatekeeperTrainerMixin

    for hook in (
        "_save_checkpoint", "_load_from_checkpoint", "_load_optimizer_and_scheduler",
        "_load_scaler", "_load_rng_state", "_load_best_model", "get_train_dataloader", "train",
    ):  # fmt: skip
        assert getattr(StatekeeperTrainer, hook) is not getattr(Trainer, hook), hook
        assert getattr(StatekeeperTrainer, hook) is getattr(StatekeeperTrainerMixin, hook), hook
