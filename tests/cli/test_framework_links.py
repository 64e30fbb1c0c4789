"""A framework folder's entries that are symbolic links are named as links, never followed:
``ls`` and ``verify`` neither read the bytes a link points to nor walk the tree it points
to (a link to ``/`` would walk the whole file system)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from click.testing import Result


def test_linked_entries_are_named_as_links_and_never_followed(
    invoke: Callable[..., Result], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tree").mkdir(parents=True)
    torch.save({"state_dict": {"w": torch.ones(2)}}, elsewhere / "real.ckpt")
    (elsewhere / "tree" / "big.bin").write_bytes(b"x" * 100_000)
    folder = tmp_path / "lightning"
    folder.mkdir()
    torch.save({"state_dict": {"w": torch.ones(2)}}, folder / "epoch=0-step=1.ckpt")
    (folder / "epoch=0-step=2.ckpt").symlink_to(elsewhere / "real.ckpt")
    (folder / "epoch=0-step=3.ckpt").symlink_to(elsewhere / "tree", target_is_directory=True)
    listed = invoke("ls", folder, "--json")
    assert listed.exit_code == 0, listed.output
    rows = {e["name"]: e for e in json.loads(listed.output)["entries"]}
    assert rows["epoch=0-step=1.ckpt"]["error"] is None  # a plain file is read as before
    for name in ("epoch=0-step=2.ckpt", "epoch=0-step=3.ckpt"):
        assert rows[name]["format"] is None and rows[name]["bytes"] == 0, rows[name]
        assert "symbolic link" in rows[name]["error"], rows[name]
    verified = invoke("verify", folder)
    assert verified.exit_code == 1
    assert verified.output.count("symbolic link") == 2, verified.output
