"""What a manifest's ``origin`` records: secrets on the command line redacted by default,
``Origin`` / ``STATEKEEPER_ORIGIN`` to record more or less."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import statekeeper as sk

SECRET_ARGV = [
    "train.py",
    "--token", "tok-aaaa1111",
    "--api-key=key-bbbb2222",
    "--password", "pw-cccc3333",
    "--secret", "sec-dddd4444",
    "--hf-token=hf-eeee5555",
    "HF_TOKEN=hfv-ffff6666",
    "OPENAI_API_KEY=oai-gggg7777",
    "trainer.wandb.api_key=wb-hhhh8888",
    "--data", "s3://alice:pass-iiii9999@bucket/data",
    "hf_abcdefghijklmnopqrstuvwxyz0123",
    "--lr", "0.1",
    "--key", "model",
    "--max-tokens", "100",
    "--resume",
]  # fmt: skip
SECRETS = [
    "tok-aaaa1111", "key-bbbb2222", "pw-cccc3333", "sec-dddd4444", "hf-eeee5555",
    "hfv-ffff6666", "oai-gggg7777", "wb-hhhh8888", "pass-iiii9999",
    "hf_abcdefghijklmnopqrstuvwxyz0123",
]  # fmt: skip


@pytest.fixture
def secret_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", SECRET_ARGV)
    monkeypatch.delenv("STATEKEEPER_ORIGIN", raising=False)


def _manifest(run: Path, step: int) -> tuple[str, dict[str, object]]:
    text = (run / f"step_{step:09d}" / "manifest.json").read_text()
    return text, json.loads(text).get("origin", {})


@pytest.mark.usefixtures("secret_argv")
def test_secret_looking_arguments_are_redacted_by_default(tmp_path: Path) -> None:
    info = sk.save(tmp_path, {"w": torch.ones(1)}, step=1)
    text, origin = _manifest(tmp_path, 1)
    for secret in SECRETS:
        assert secret not in text, secret
    assert origin["argv"] == [
        "train.py",
        "--token", "[redacted]",
        "--api-key=[redacted]",
        "--password", "[redacted]",
        "--secret", "[redacted]",
        "--hf-token=[redacted]",
        "HF_TOKEN=[redacted]",
        "OPENAI_API_KEY=[redacted]",
        "trainer.wandb.api_key=[redacted]",
        "--data", "s3://alice:[redacted]@bucket/data",
        "[redacted]",
        "--lr", "0.1", "--key", "model", "--max-tokens", "100", "--resume",
    ]  # fmt: skip
    assert origin["hostname"] and info.origin == origin


@pytest.mark.usefixtures("secret_argv")
def test_full_records_the_command_line_as_run(tmp_path: Path) -> None:
    sk.save(tmp_path, {"w": torch.ones(1)}, step=1, origin=sk.training.Origin.FULL)
    assert _manifest(tmp_path, 1)[1]["argv"] == SECRET_ARGV


@pytest.mark.usefixtures("secret_argv")
def test_minimal_records_neither_command_line_nor_host(tmp_path: Path) -> None:
    with sk.Checkpointer(tmp_path, origin=sk.training.Origin.MINIMAL) as ckpt:
        ckpt.save(1, {"w": torch.ones(1)})
    text, origin = _manifest(tmp_path, 1)
    assert "argv" not in origin and "hostname" not in origin
    assert origin["world_size"] == 1 and "cpu" in origin["devices"]
    assert "train.py" not in text
    sk.save(tmp_path, {"w": torch.ones(1)}, step=2, origin=sk.training.Origin.NONE)
    assert '"origin"' not in _manifest(tmp_path, 2)[0]


@pytest.mark.usefixtures("secret_argv")
def test_the_environment_sets_the_level_for_a_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATEKEEPER_ORIGIN", "Minimal")
    sk.save(tmp_path, {"w": torch.ones(1)}, step=1)
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.save(2, {"w": torch.ones(1)})
    for step in (1, 2):
        assert {"argv", "hostname"}.isdisjoint(_manifest(tmp_path, step)[1])
    sk.save(tmp_path, {"w": torch.ones(1)}, step=3, origin=sk.training.Origin.FULL)  # the call wins
    assert _manifest(tmp_path, 3)[1]["argv"] == SECRET_ARGV


@pytest.mark.usefixtures("secret_argv")
def test_a_wrong_level_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(sk.errors.InvalidArgumentError, match=r"statekeeper\.training\.Origin"):
        sk.save(tmp_path, {"w": torch.ones(1)}, step=1, origin="minimal")
    monkeypatch.setenv("STATEKEEPER_ORIGIN", "secret")
    with pytest.raises(
        sk.errors.InvalidArgumentError, match=r"STATEKEEPER_ORIGIN='secret'.*minimal"
    ):
        sk.save(tmp_path, {"w": torch.ones(1)}, step=1)
    with pytest.raises(sk.errors.InvalidArgumentError, match="STATEKEEPER_ORIGIN"):
        sk.Checkpointer(tmp_path)
    assert sk.list_checkpoints(tmp_path) == []
