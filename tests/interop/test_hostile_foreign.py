"""Foreign checkpoints on hostile or broken storage (issue #14).

Each foreign format (Hugging Face index folder, single safetensors file, DCP folder,
Accelerate folder, ``torch.save`` file) is attacked through its files: a shard that is a
link to ``/dev/zero``, a FIFO in place of a file, names from a document that leave the
folder, deeply nested JSON, and size claims far beyond the bytes present. Every attack must
end in ``CorruptCheckpointError`` naming the file, from the Python API and from the CLI.

Links: foreign folders may hold symbolic links (the Hugging Face hub cache links every
snapshot file to a blob elsewhere), so a link to a regular file is followed, wherever it
points; a link to anything else is refused. Statekeeper's own steps refuse links
altogether (that is the statekeeper reader's business, tested with it).

Nothing here is decided by timing: a read that could block (a FIFO) runs in a thread, and
if it has not finished after a generous timeout the FIFO is opened for writing to release
it and the test fails saying so. Reads that could allocate a claimed size, or crash the
interpreter, run in a child process whose address space is capped a little above what it
starts with: an attempted allocation then fails there instead of here.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from tests.helpers import launcher
from tests.interop import formats
from tests.interop.formats import (
    TIB4,
    compressed_item,
    deep_list_pt,
    deep_tuple_pt,
    legacy_claiming,
    stride0_pt,
)

import statekeeper as sk
from statekeeper.cli.main import main
from statekeeper.storage.files import NAME_RULE

TIMEOUT = 60.0
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- helpers


def _release(fifo: Path) -> None:
    """Unblock a reader waiting in ``open(fifo)``: open the write end and close it."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


def outcome(call: Callable[[], Any], fifo: Path | None = None) -> BaseException | None:
    """What ``call()`` raised (None when it returned), run in a thread; a call that is still
    blocked after TIMEOUT seconds fails the test."""
    result: dict[str, BaseException | None] = {"raised": None}

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # reported to the test
            result["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    if thread.is_alive():
        if fifo is not None:
            _release(fifo)
        thread.join(10)
        what = f": it opened the FIFO {fifo} to read it" if fifo is not None else ""
        pytest.fail(f"reading did not finish in {TIMEOUT:.0f}s{what}")
    return result["raised"]


def assert_corrupt(raised: BaseException | None, path: Path, *words: str) -> None:
    assert isinstance(raised, sk.CorruptCheckpointError), f"expected corruption, got {raised!r}"
    assert raised.path == str(path), str(raised)
    for word in words:
        assert word in str(raised), str(raised)


def replace_with_fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def replace_with_zero(path: Path) -> Path:
    path.unlink()
    path.symlink_to("/dev/zero")
    return path


CHILD = r"""
import json, resource, sys
import torch, torch.distributed.checkpoint
import statekeeper as sk
from click.testing import CliRunner
from statekeeper.cli.main import main
from statekeeper.interop.reading import read_foreign  # everything imported before the cap

mode, *args = sys.argv[1:]
size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
cap = size + (2 << 30)  # 2 GiB more than what the interpreter holds now
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
if mode == "read":
    try:
        sk.read(args[0])
        out = {"raised": None}
    except BaseException as exc:
        out = {"raised": type(exc).__name__, "message": str(exc),
               "corrupt": isinstance(exc, sk.CorruptCheckpointError)}
else:
    out = {"runs": []}
    for command in json.loads(args[0]):
        result = CliRunner().invoke(main, command)
        out["runs"].append({"code": result.exit_code, "stderr": result.stderr,
                            "raised": repr(result.exception)})
print(json.dumps(out))
"""


def in_child(mode: str, arg: str) -> dict[str, Any]:
    """Run ``sk.read(arg)`` (mode "read") or the CLI commands ``arg`` (a JSON list, mode
    "cli") in a child whose address space may grow by 2 GiB at most."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "1000"}
    try:
        done = launcher.run(  # forked with the imports done; the cap is set after them
            [sys.executable, "-c", CHILD, mode, arg],
            capture_output=True, text=True, timeout=4 * TIMEOUT, env=env, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child process did not finish in {4 * TIMEOUT:.0f}s")
    assert done.returncode == 0, f"child died ({done.returncode}): {done.stderr[-2000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ---------------------------------------------------------------- foreign checkpoints


def hf(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A sharded Hugging Face folder, its index and one of its shards."""
    folder = formats.hf_folder(tmp_path / "hf", formats.weights())
    index = next(folder.glob("*.index.json"))
    return folder, index, sorted(folder.glob("*.safetensors"))[-1]


def dcp(tmp_path: Path, state: dict[str, Any] | None = None) -> tuple[Path, Any, Path]:
    """A DCP folder, its metadata (unpickled: the test wrote it) and its data file."""
    folder = formats.dcp_folder(tmp_path / "dcp", state or {"w": torch.arange(6.0)})
    md = pickle.loads((folder / ".metadata").read_bytes())
    return folder, md, next(folder.glob("*.distcp"))


def rewrite(folder: Path, md: Any) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(md, protocol=4))


def single(tmp_path: Path, name: str = "model.safetensors") -> Path:
    return formats.safetensors_file(tmp_path / name, formats.weights())


def torch_pt(tmp_path: Path, name: str = "model.pt") -> Path:
    return formats.torch_file(tmp_path / name, formats.weights())


def accelerate_copy(tmp_path: Path, accelerate: tuple[Path, dict[str, Any]]) -> Path:
    folder = tmp_path / "acc"
    shutil.copytree(accelerate[0], folder)
    return folder


# ---------------------------------------------------------------- /dev/zero and FIFOs


@pytest.mark.parametrize("make", [replace_with_zero, replace_with_fifo], ids=["dev-zero", "fifo"])
def test_hf_shard_and_index_that_are_not_regular_files(
    tmp_path: Path, make: Callable[[Path], Path]
) -> None:
    word = "character device" if make is replace_with_zero else "FIFO"
    folder, index, shard = hf(tmp_path / "shard")
    make(shard)
    for target in (folder, index):
        assert_corrupt(outcome(lambda t=target: sk.read(t), shard), shard, word)
    folder, index, _ = hf(tmp_path / "index")
    make(index)
    for target in (folder, index):
        assert_corrupt(outcome(lambda t=target: sk.read(t), index), index, word)


@pytest.mark.parametrize("make", [replace_with_zero, replace_with_fifo], ids=["dev-zero", "fifo"])
def test_single_files_that_are_not_regular(tmp_path: Path, make: Callable[[Path], Path]) -> None:
    word = "character device" if make is replace_with_zero else "FIFO"
    for path in (single(tmp_path), torch_pt(tmp_path), torch_pt(tmp_path, "last.ckpt")):
        make(path)
        assert_corrupt(outcome(lambda p=path: sk.read(p), path), path, word)


@pytest.mark.parametrize("make", [replace_with_zero, replace_with_fifo], ids=["dev-zero", "fifo"])
def test_dcp_files_that_are_not_regular(tmp_path: Path, make: Callable[[Path], Path]) -> None:
    word = "character device" if make is replace_with_zero else "FIFO"
    folder, _, data = dcp(tmp_path / "data")
    make(data)
    assert_corrupt(outcome(lambda: sk.read(folder), data), data, word)
    folder, _, _ = dcp(tmp_path / "metadata")
    metadata = make(folder / ".metadata")
    assert_corrupt(outcome(lambda: sk.read(folder), metadata), metadata, word)


@pytest.mark.parametrize("make", [replace_with_zero, replace_with_fifo], ids=["dev-zero", "fifo"])
@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.bin"])
def test_accelerate_files_that_are_not_regular(
    tmp_path: Path,
    accelerate: tuple[Path, dict[str, Any]],
    make: Callable[[Path], Path],
    name: str,
) -> None:
    word = "character device" if make is replace_with_zero else "FIFO"
    folder = accelerate_copy(tmp_path, accelerate)
    target = make(folder / name)
    assert_corrupt(outcome(lambda: sk.read(folder), target), target, word)


# ---------------------------------------------------------------- names and links


@pytest.mark.parametrize("kind", ["parent", "absolute", "nested"])
def test_weight_map_names_must_be_plain_names(tmp_path: Path, kind: str) -> None:
    folder, index, shard = hf(tmp_path)
    outside = tmp_path / "outside.safetensors"
    nested = folder / "a" / "b.safetensors"
    nested.parent.mkdir()
    for copy in (outside, nested):  # files that would read back fine
        shutil.copyfile(shard, copy)
    name = {"parent": "../outside.safetensors", "absolute": str(outside),
            "nested": "a/b.safetensors"}[kind]  # fmt: skip
    doc = json.loads(index.read_text())
    doc["weight_map"] = {k: name if v == shard.name else v for k, v in doc["weight_map"].items()}
    index.write_text(json.dumps(doc))
    for target in (folder, index):
        assert_corrupt(outcome(lambda t=target: sk.read(t)), index, repr(name), NAME_RULE)


@pytest.mark.parametrize("kind", ["parent", "absolute", "nested"])
def test_dcp_relative_paths_must_be_plain_names(tmp_path: Path, kind: str) -> None:
    folder, md, data = dcp(tmp_path)
    outside = tmp_path / "outside.distcp"
    nested = folder / "a" / data.name
    nested.parent.mkdir()
    for copy in (outside, nested):
        shutil.copyfile(data, copy)
    name = {"parent": "../outside.distcp", "absolute": str(outside),
            "nested": f"a/{data.name}"}[kind]  # fmt: skip
    for info in md.storage_data.values():
        info.relative_path = name
    rewrite(folder, md)
    assert_corrupt(outcome(lambda: sk.read(folder)), folder / ".metadata", repr(name), NAME_RULE)


def test_links_are_followed_inside_the_folder_and_into_the_hub_cache_blobs_only(
    tmp_path: Path, accelerate: tuple[Path, dict[str, Any]]
) -> None:
    """The Hugging Face hub cache layout (``<repo>/snapshots/<rev>/file`` linking to
    ``<repo>/blobs/<hash>``) reads; a listed file that links anywhere else is refused."""
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.parent.mkdir(parents=True)
    built, _, _ = hf(tmp_path)
    expected = sk.read(built)
    shutil.move(built, snapshot)
    blobs = repo / "blobs"
    blobs.mkdir()
    for path in sorted(snapshot.iterdir()):
        blob = blobs / f"blob-{path.name}"
        shutil.move(path, blob)
        path.symlink_to(Path("../../blobs") / blob.name)
    assert list(sk.read(snapshot)) == list(expected)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    folder, index, shard = hf(tmp_path / "plain")
    moved = outside / shard.name
    shutil.move(shard, moved)
    shard.symlink_to(moved)  # a regular file with the right bytes, outside the folder
    assert_corrupt(outcome(lambda: sk.read(folder)), index, "leads outside the checkpoint")

    dcp_folder, _, data = dcp(tmp_path)
    inside = dcp_folder / "real.bin"
    shutil.move(data, inside)
    data.symlink_to(inside.name)  # a link that stays inside the folder is fine
    assert torch.equal(sk.read(dcp_folder)["w"], torch.arange(6.0))
    data.unlink()
    shutil.move(inside, outside / "real.bin")
    data.symlink_to(outside / "real.bin")
    assert_corrupt(outcome(lambda: sk.read(dcp_folder)), dcp_folder / ".metadata", "leads outside")

    acc = accelerate_copy(tmp_path, accelerate)
    loop = acc / "optimizer.bin"
    loop.unlink()
    loop.symlink_to(loop)
    assert_corrupt(outcome(lambda: sk.read(acc)), loop, "loop")


# ---------------------------------------------------------------- bounded JSON


DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_index_is_corrupt(tmp_path: Path) -> None:
    folder, index, _ = hf(tmp_path)
    index.write_text('{"weight_map": ' + DEEP + "}")
    for target in (folder, index):
        assert_corrupt(outcome(lambda t=target: sk.read(t)), index, "nested too deeply")


def header_file(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def test_deeply_nested_safetensors_header_and_aliases_are_corrupt(tmp_path: Path) -> None:
    path = header_file(tmp_path / "deep.safetensors", ('{"a": ' + DEEP + "}").encode())
    assert_corrupt(outcome(lambda: sk.read(path)), path, "nested too deeply")
    aliases = json.dumps({"__metadata__": {"aliases": DEEP}}).encode()
    path = header_file(tmp_path / "aliases.safetensors", aliases)
    assert_corrupt(outcome(lambda: sk.read(path)), path, "aliases", "nested too deeply")


def test_documents_over_their_caps_are_refused_unread(tmp_path: Path) -> None:
    folder, index, _ = hf(tmp_path)
    os.truncate(index, (256 << 20) + 1)  # sparse: no disk used, never read
    assert_corrupt(outcome(lambda: sk.read(folder)), index, "larger than")
    path = header_file(tmp_path / "big.safetensors", b"{}")
    with path.open("r+b") as f:
        f.write((100_000_001).to_bytes(8, "little"))
        f.truncate(200_000_000)
    assert_corrupt(outcome(lambda: sk.read(path)), path, "larger than")
    dcp_folder, _, _ = dcp(tmp_path)
    os.truncate(dcp_folder / ".metadata", (256 << 20) + 1)
    assert_corrupt(outcome(lambda: sk.read(dcp_folder)), dcp_folder / ".metadata", "larger than")


# ---------------------------------------------------------------- size claims


def four_tib_dcp(tmp_path: Path) -> Path:
    """A DCP folder whose ``.metadata`` claims a 4 TiB tensor tiled by one chunk."""
    folder, md, _ = dcp(tmp_path)
    meta = md.state_dict_metadata["w"]
    meta.size = torch.Size([TIB4 // 4])  # float32
    meta.chunks[0].sizes = torch.Size([TIB4 // 4])
    rewrite(folder, md)
    return folder


def test_dcp_claiming_a_4_tib_tensor_is_refused_before_allocating(tmp_path: Path) -> None:
    folder = four_tib_dcp(tmp_path)
    got = in_child("read", str(folder))
    assert got["raised"] == "CorruptCheckpointError", got
    data = next(folder.glob("*.distcp"))
    assert str(data) in got["message"] and "less than the" in got["message"], got


def test_dcp_items_must_lie_inside_their_files_and_back_their_tensors(tmp_path: Path) -> None:
    folder, md, data = dcp(tmp_path / "length")
    for info in md.storage_data.values():
        info.length = TIB4
    rewrite(folder, md)
    assert_corrupt(outcome(lambda: sk.read(folder)), data, "runs past the end")
    # one real item reused by 1000 chunks: each chunk is backed, the tensor is not
    folder, md, data = dcp(tmp_path / "reused")
    meta = md.state_dict_metadata["w"]
    info = md.storage_data[next(iter(md.storage_data))]
    index_type = type(next(iter(md.storage_data)))
    chunk_type = type(meta.chunks[0])
    meta.size = torch.Size([6 * 1000])
    meta.chunks = [
        chunk_type(offsets=torch.Size([6 * i]), sizes=torch.Size([6])) for i in range(1000)
    ]
    md.storage_data = {index_type("w", torch.Size([6 * i])): info for i in range(1000)}
    rewrite(folder, md)
    assert_corrupt(
        outcome(lambda: sk.read(folder)), folder / ".metadata", "the data files hold only"
    )


def test_dcp_planner_paths_cannot_open_huge_lists_or_nest_deeply(tmp_path: Path) -> None:
    folder, md, _ = dcp(tmp_path / "deep")
    md.planner_data = {"w": tuple(["d"] * 10_000)}
    rewrite(folder, md)
    assert_corrupt(outcome(lambda: sk.read(folder)), folder / ".metadata", "key path")
    folder, md, _ = dcp(tmp_path / "huge")
    md.planner_data = {"w": ("w", 10**12)}  # a list of 10**12 Nones, were it built
    rewrite(folder, md)
    got = in_child("read", str(folder))
    assert got["raised"] == "CorruptCheckpointError" and "key path" in got["message"], got


def test_compressed_zip_entries_are_refused(tmp_path: Path) -> None:
    """``torch.save`` never compresses; a deflated record can claim any size (zip bomb)."""
    path = tmp_path / "deflated.pt"
    path.write_bytes(compressed_item({"w": torch.zeros(1 << 14, dtype=torch.uint8)}))
    assert_corrupt(outcome(lambda: sk.read(path)), path, "compressed")
    folder, md, data = dcp(tmp_path, {"w": torch.arange(6.0), "extra": {"n": 7}})
    bomb = compressed_item({"n": 7})
    (key,) = [k for k in md.storage_data if k.fqn == "extra.n"]
    md.storage_data[key].offset = data.stat().st_size
    md.storage_data[key].length = len(bomb)
    with data.open("ab") as f:
        f.write(bomb)
    rewrite(folder, md)
    raised = outcome(lambda: sk.read(folder))
    assert isinstance(raised, sk.CorruptCheckpointError) and "compressed" in str(raised), raised
    assert str(data) in raised.path


def test_pt_views_that_repeat_a_tiny_storage_are_refused(tmp_path: Path) -> None:
    """A stride-0 view of 4 bytes claiming 4 TiB: any later contiguous() would allocate it."""
    path = stride0_pt(tmp_path / "stride0.pt")
    assert_corrupt(outcome(lambda: sk.read(path)), path, "claims 4398046511104 bytes")
    small = tmp_path / "expanded.pt"
    torch.save({"w": torch.ones(1).expand(16)}, small)  # smaller than the file: still read
    assert torch.equal(sk.read(small)["w"], torch.ones(16))


def test_legacy_pt_claiming_4_tib_is_refused_before_allocating(tmp_path: Path) -> None:
    path = legacy_claiming(tmp_path / "legacy.pt", TIB4)
    got = in_child("read", str(path))
    assert got["raised"] == "CorruptCheckpointError", got
    assert "claim 4398046511104 bytes" in got["message"] and "allocate" not in got["message"]


def test_pt_nesting_is_bounded(tmp_path: Path) -> None:
    path = deep_list_pt(tmp_path / "list.pt", 100_000)
    assert_corrupt(outcome(lambda: sk.read(path)), path, "nested deeper than")
    # a million nested tuples as a dict key: hashing it recurses in C and crashes CPython
    path = deep_tuple_pt(tmp_path / "tuple.pt", 1_000_000)
    got = in_child("read", str(path))
    assert got["raised"] == "CorruptCheckpointError" and "levels deep" in got["message"], got


# ---------------------------------------------------------------- the CLI


def cli_cases(tmp_path: Path) -> dict[str, tuple[Path, Path, str]]:
    """Case -> (what to pass to the CLI, the file its error must name, what it must say)."""
    folder, _, shard = hf(tmp_path / "zero")
    replace_with_zero(shard)
    pt = replace_with_zero(torch_pt(tmp_path, "zero.pt"))
    fifo_folder, _, data = dcp(tmp_path / "fifo")
    replace_with_fifo(data)
    index_folder, index, _ = hf(tmp_path / "fifo-index")
    replace_with_fifo(index)
    fifo_pt = replace_with_fifo(torch_pt(tmp_path))
    return {
        "dev-zero-hf": (folder, shard, "character device"),
        "dev-zero-pt": (pt, pt, "character device"),
        "fifo-dcp": (fifo_folder, data, "FIFO"),
        "fifo-index": (index_folder, index, "FIFO"),
        "fifo-pt": (fifo_pt, fifo_pt, "FIFO"),
    }


def commands(target: Path, good: Path, out: Path) -> list[list[str]]:
    return [
        ["inspect", str(target)],
        ["diff", str(target), str(good)],
        ["diff", str(good), str(target)],
        ["convert", str(target), "-o", str(out / "run")],
        ["convert", str(target), "-o", str(out / "x.safetensors")],
        ["export", str(target), "-o", str(out / "y.safetensors")],
        ["verify", str(target)],
    ]


def assert_one_line_error(code: int, stderr: str, named: Path) -> None:
    assert code != 0, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    assert "Traceback" not in stderr


def test_cli_reports_hostile_files_in_one_line(tmp_path: Path) -> None:
    good = single(tmp_path)
    runner = CliRunner(env={"COLUMNS": "1000"})
    for case, (target, named, word) in cli_cases(tmp_path / "cases").items():
        for command in commands(target, good, tmp_path / "out" / case):
            fifo = named if "fifo" in case else None
            results: list[Any] = []
            raised = outcome(lambda c=command, r=results: r.append(runner.invoke(main, c)), fifo)
            assert raised is None, raised
            result = results[0]
            assert_one_line_error(result.exit_code, result.stderr, named)
            if command[0] != "verify":  # verify reads statekeeper steps only
                assert str(named) in result.stderr and word in result.stderr, (command, result)


def test_cli_on_a_4_tib_claim_does_not_allocate(tmp_path: Path) -> None:
    folder = four_tib_dcp(tmp_path / "dcp")
    legacy = legacy_claiming(tmp_path / "legacy.pt", TIB4)
    good = single(tmp_path)
    data = next(folder.glob("*.distcp"))
    runs = [(c, data) for c in commands(folder, good, tmp_path / "o1")[:-1]]
    runs += [(c, legacy) for c in commands(legacy, good, tmp_path / "o2")[:-1]]
    got = in_child("cli", json.dumps([c for c, _ in runs]))
    for (command, named), run in zip(runs, got["runs"], strict=True):
        assert_one_line_error(run["code"], run["stderr"], named)
        assert str(named) in run["stderr"], (command, run)
        assert "allocate" not in run["stderr"], (command, run)


# ---------------------------------------------------------------- offline averaging


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "link"])
def test_average_opens_only_regular_shards_of_statekeeper_steps(tmp_path: Path, kind: str) -> None:
    """Statekeeper's own steps never hold links: even one to a regular file is refused."""
    from statekeeper.averaging.offline import average_checkpoints

    steps = [sk.save(tmp_path / f"run{i}", {"model": {"w": torch.ones(3) * i}}, step=1).path
             for i in range(2)]  # fmt: skip
    (shard,) = Path(steps[0]).glob("*.safetensors")
    if kind == "fifo":
        replace_with_fifo(shard)
    elif kind == "dev-zero":
        replace_with_zero(shard)
    else:
        moved = tmp_path / "elsewhere.safetensors"
        shutil.move(shard, moved)
        shard.symlink_to(moved)
    word = {"fifo": "FIFO", "dev-zero": "symbolic link", "link": "symbolic link"}[kind]
    raised = outcome(lambda: average_checkpoints(steps, tmp_path / "out"), shard)
    assert_corrupt(raised, shard, word)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_tuple_depth_follows_the_pickle_stack(protocol: int) -> None:
    import io

    from statekeeper.interop.torch_checks import tuple_depth

    def nest(n: int) -> Any:
        x: Any = ()
        for _ in range(n):
            x = (x, 1)
        return x

    cases = [(nest(50), 51), ({nest(10): [nest(20)] * 2}, 21), ([1, {"a": (1, (2,))}], 2),
             ("x", 0), ([nest(3)] * 3, 4)]  # fmt: skip
    for obj, depth in cases:
        assert tuple_depth(io.BytesIO(pickle.dumps(obj, protocol=protocol))) == depth
    # POP right after MARK drops the MARK, as pickle does: (1, ((((),),),))
    assert tuple_depth(io.BytesIO(b"\x80\x02K\x01(0)\x85\x85\x85\x86.")) == 5


def test_a_foreign_folder_named_like_a_step_is_still_foreign(tmp_path: Path) -> None:
    """A Hugging Face folder saved as ``ckpts/step_1000`` reads as what it is."""
    folder = formats.hf_folder(tmp_path / "ckpts" / "step_1000", formats.weights())
    assert set(sk.read(folder)) == set(formats.weights())
    result = CliRunner().invoke(main, ["inspect", str(folder)])
    assert result.exit_code == 0 and "(huggingface)" in result.output, result.output
    lost = tmp_path / "run" / "step_000000002"  # a statekeeper step whose manifest is gone
    sk.save(tmp_path / "run", {"w": torch.ones(2)}, step=2)
    (lost / "manifest.json").unlink()
    with pytest.raises(sk.CorruptCheckpointError, match=r"manifest\.json is missing"):
        sk.read(lost)


def test_damage_in_a_foreign_file_does_not_advise_older_steps(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(sk.CorruptCheckpointError) as caught:
        sk.read(path)
    assert "older step" not in str(caught.value) and "restore the file" in str(caught.value)
