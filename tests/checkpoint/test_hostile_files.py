"""Odd files in a committed step: links, FIFOs, devices, names that leave the step, deep JSON.

Every case must end in the documented error naming the file, from ``load`` (live objects
untouched), ``read`` and the listing, and never hang, read without bound or crash.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tests.helpers.hostile import (
    ENTRY,
    MANIFEST,
    SHARD,
    finishes,
    replace_with_fifo,
    replace_with_link,
    rewrite_manifest,
    saved_run,
    set_file_record,
    small_state,
)

import statekeeper as sk
from statekeeper import CorruptCheckpointError


def _load_untouched(run: Path) -> BaseException | None:
    """``load`` into a fresh state; asserts the live module was not changed."""
    live = small_state(99)
    before = {k: v.clone() for k, v in live["model"].state_dict().items()}
    error = finishes(lambda: sk.load(run, live))
    for key, value in live["model"].state_dict().items():
        assert torch.equal(value, before[key]), f"live {key} changed by a failed load"
    return error


def _assert_refused(run: Path, needle: str) -> None:
    for error in (_load_untouched(run), finishes(lambda: sk.read(run))):
        assert isinstance(error, CorruptCheckpointError), repr(error)
        assert needle in str(error), str(error)


def test_a_shard_linked_to_dev_zero_is_refused_unread(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    replace_with_link(run / ENTRY / SHARD, "/dev/zero")
    _assert_refused(run, f"{SHARD}: is a symbolic link, not a regular file")


def test_a_fifo_in_place_of_a_shard_never_hangs(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    replace_with_fifo(run / ENTRY / SHARD)
    _assert_refused(run, "is a FIFO (named pipe), not a regular file")


def test_a_fifo_in_place_of_the_manifest_never_hangs(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    replace_with_fifo(run / ENTRY / MANIFEST)
    _assert_refused(run, f"{MANIFEST}: is a FIFO")
    infos = sk.list_checkpoints(run)
    assert [i.step for i in infos] == [1]
    assert infos[0].error is not None and "FIFO" in infos[0].error


def test_a_link_to_a_matching_copy_outside_the_step_is_refused(tmp_path: Path) -> None:
    """The link's target has the right size and checksum: it still is not loaded."""
    run = saved_run(tmp_path / "run")
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((run / ENTRY / SHARD).read_bytes())
    replace_with_link(run / ENTRY / SHARD, outside)
    _assert_refused(run, "is a symbolic link")


@pytest.mark.parametrize(
    "name",
    ["../outside.safetensors", "/etc/hostname", "sub/dir.safetensors", "..", "a b", ""],
)
def test_manifest_file_names_must_be_plain_names_in_the_step(tmp_path: Path, name: str) -> None:
    run = saved_run(tmp_path / "run")
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((run / ENTRY / SHARD).read_bytes())
    rewrite_manifest(run / ENTRY, lambda text: text.replace(f'"{SHARD}"', json.dumps(name)))
    for error in (_load_untouched(run), finishes(lambda: sk.read(run))):
        assert isinstance(error, CorruptCheckpointError), repr(error)
        assert f"file name {name!r} is not one path component" in str(error)
        assert "outside" not in str(error).split("file name")[0]  # no size of the outside file


@pytest.mark.parametrize("depth", [100_000, 500])
def test_deeply_nested_state_in_a_manifest_is_damage(tmp_path: Path, depth: int) -> None:
    run = tmp_path
    with sk.Checkpointer(run) as ckpt:
        for step in (1, 2):
            ckpt.save(step, small_state(step))
    deep = "[" * depth + "]" * depth

    def edit(text: str) -> str:
        start = text.index('"state":')
        end = text.index(',\n"manifest_checksum"')
        return text[:start] + '"state":{"epoch":' + deep + "}" + text[end:]

    rewrite_manifest(run / "step_000000002", edit)
    error = finishes(lambda: sk.read(run))
    assert isinstance(error, CorruptCheckpointError), repr(error)
    assert "step_000000002" in str(error) and "nested" in str(error)
    infos = sk.list_checkpoints(run)  # the listing survives; the bad step is marked
    assert [i.step for i in infos] == [1, 2]
    assert infos[0].error is None
    if depth > 1000:  # the parser itself refuses; a shallower tree fails when decoded
        assert infos[1].error is not None and "nested too deeply" in infos[1].error
    live = small_state(7)
    with (
        pytest.warns(sk.StatekeeperWarning, match="skipping damaged step 2"),
        sk.Checkpointer(run) as ckpt,
    ):
        assert ckpt.restore_latest(live) == 1
    assert live["epoch"] == 1  # the plain value of the step that was loaded


def test_deeply_nested_metrics_are_damage(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    deep = "[" * 300 + "]" * 300
    rewrite_manifest(run / ENTRY, lambda t: t.replace('"metrics":{}', f'"metrics":{{"x":{deep}}}'))
    infos = sk.list_checkpoints(run)
    assert infos[0].error is not None and "metrics are nested deeper" in infos[0].error


@pytest.mark.parametrize(
    ("metric", "says"),
    [('{"$zzz":1}', "unknown tag"), ('{"$tensor":"w"}', "cannot reference tensor")],
)
def test_a_malformed_metric_is_damage_everywhere_it_is_read(
    tmp_path: Path, metric: str, says: str
) -> None:
    """A metric that is no valid tagged value (its self-checksum made to match): listing gives
    the step with its error, ``inspect`` and the CLI's ``ls`` name the manifest; no
    internal error type and no traceback reach the user."""
    run = saved_run(tmp_path)
    rewrite_manifest(
        run / ENTRY, lambda t: t.replace('"metrics":{}', f'"metrics":{{"loss":{metric}}}')
    )
    infos = sk.list_checkpoints(run)
    assert infos[0].error is not None and "metrics are malformed" in infos[0].error, infos
    assert says in infos[0].error and MANIFEST in infos[0].error
    with pytest.raises(CorruptCheckpointError, match="metrics are malformed"):
        sk.audit.inspect(run)
    from statekeeper.cli.main import main as cli

    done = CliRunner().invoke(cli, ["ls", str(run), "--json"])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    assert "metrics are malformed" in done.output


def test_deeply_nested_safetensors_header_is_damage(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    header = b"[" * 100_000 + b"]" * 100_000
    set_file_record(run / ENTRY, SHARD, len(header).to_bytes(8, "little") + header)
    error = _load_untouched(run)
    assert isinstance(error, CorruptCheckpointError), repr(error)
    assert SHARD in str(error) and "nested too deeply" in str(error)


def test_a_huge_header_length_is_refused_before_reading(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    data = (1 << 62).to_bytes(8, "little") + b"{}"
    set_file_record(run / ENTRY, SHARD, data)
    error = _load_untouched(run)
    assert isinstance(error, CorruptCheckpointError)
    assert "runs past the end of the file" in str(error)


def test_a_state_nested_too_deep_is_refused_at_save_so_every_save_reads_back(
    tmp_path: Path,
) -> None:
    deep: object = 0
    for _ in range(150):
        deep = [deep]
    with pytest.raises(sk.errors.UnsupportedValueError, match="nested deeper than 100 levels"):
        sk.save(tmp_path, {"x": deep}, step=1)
    assert sk.list_checkpoints(tmp_path) == []
    ok: object = 0
    for _ in range(90):
        ok = [ok]
    sk.save(tmp_path, {"x": ok}, step=1)
    assert sk.read(tmp_path)["x"] == ok


def test_a_file_whose_size_differs_is_refused_before_it_is_mapped(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    with open(run / ENTRY / SHARD, "ab") as f:
        f.truncate(1 << 40)  # a sparse 1 TiB file: reading it would never end
    error = _load_untouched(run)
    assert isinstance(error, CorruptCheckpointError)
    assert f"size is {1 << 40} bytes, the manifest says" in str(error)


def test_only_regular_files_are_listed_in_a_step(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    os.mkfifo(run / ENTRY / "extra.safetensors")
    (run / ENTRY / "link.safetensors").symlink_to("/dev/zero")
    assert sk.storage.LocalStorage(run).files(ENTRY) == [MANIFEST, SHARD]
    assert sk.read(run)["epoch"] == 1  # the strays are not the step's: it still loads


def test_a_step_directory_that_is_a_link_is_never_read_or_followed(tmp_path: Path) -> None:
    """A link named like a step, pointing at a real step elsewhere: listed as damaged,
    skipped by restore_latest, and removing it removes the link, never its target."""
    run = saved_run(tmp_path / "run", steps=(1,))
    elsewhere = saved_run(tmp_path / "elsewhere", steps=(9,))
    (run / "step_000000009").symlink_to(elsewhere / "step_000000009")
    infos = {i.step: i.error for i in sk.list_checkpoints(run)}
    assert infos[1] is None and infos[9] is not None and "symbolic link" in infos[9]
    error = finishes(lambda: sk.read(run))
    assert isinstance(error, CorruptCheckpointError) and "step_000000009" in str(error)
    state = {"model": small_state(0)["model"], "epoch": 0}
    with (
        pytest.warns(sk.StatekeeperWarning, match="skipping damaged step 9"),
        sk.Checkpointer(run) as ckpt,
    ):
        assert ckpt.restore_latest(state, strict=sk.Strict.ALLOW_MISSING) == 1
    sk.storage.LocalStorage(run).remove("step_000000009")
    assert not (run / "step_000000009").exists()
    assert [p.name for p in run.iterdir() if "step_000000009" in p.name] == []
    assert (elsewhere / "step_000000009" / MANIFEST).is_file()  # the target is untouched
