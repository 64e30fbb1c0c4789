"""Bad input to the public API is a statekeeper error of the right kind (a ``TypeError`` for a
wrong type, a ``ValueError`` for a bad value, an ``OSError`` with its errno for a path that
cannot work) naming the argument or key path and the fix, never a bare builtin error; and
values that can round-trip (any int, numpy scalars as metrics) read back as saved."""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.helpers.hostile import rewrite_manifest
from torch.utils._python_dispatch import TorchDispatchMode

import statekeeper as sk

Call = Callable[[Path], Any]


def _ckpt(tmp: Path, **kwargs: Any) -> sk.Checkpointer:
    return sk.Checkpointer(tmp / "ckpt", **kwargs)


def _with_ckpt(use: Callable[[sk.Checkpointer], Any], **kwargs: Any) -> Call:
    def call(tmp: Path) -> Any:
        with _ckpt(tmp, **kwargs) as ckpt:
            return use(ckpt)

    return call


def _saved(tmp: Path) -> Path:
    sk.save(tmp / "run", {"x": torch.zeros(2)}, step=1)
    return tmp / "run"


# (call, error class, builtin it must also be, words the message must hold)
WRONG_TYPES: dict[str, tuple[Call, tuple[str, ...]]] = {
    "save state=[...]": (lambda t: sk.save(t / "r", [1, 2], step=1), ("state", "mapping")),
    "load state=[...]": (lambda t: sk.load(_saved(t), [1]), ("state", "mapping")),
    "Checkpointer.save state=[...]": (_with_ckpt(lambda c: c.save(1, [1])), ("state", "mapping")),
    "maybe_save state=None": (
        _with_ckpt(lambda c: c.maybe_save(1, None), every=sk.EverySteps(1)),
        ("state", "mapping"),
    ),
    "restore_latest(None)": (_with_ckpt(lambda c: c.restore_latest(None)), ("state", "mapping")),
    "save metrics=[...]": (
        lambda t: sk.save(t / "r", {"x": 1}, step=1, metrics=[1]),
        ("metrics", "mapping", "val_loss"),
    ),
    "save metrics=5": (
        lambda t: sk.save(t / "r", {"x": 1}, step=1, metrics=5),
        ("metrics", "mapping"),
    ),
    "maybe_save metrics=5": (
        _with_ckpt(lambda c: c.maybe_save(1, {"x": 1}, 5), every=sk.EverySteps(1)),
        ("metrics", "mapping"),
    ),
    "verify(progress=5)": (
        lambda t: sk.audit.verify(_saved(t), progress=5),
        ("progress", "callable"),
    ),
    "load(progress=5)": (
        lambda t: sk.load(_saved(t), {"x": torch.zeros(2)}, progress=5),
        ("progress", "callable"),
    ),
    "read(progress=5)": (lambda t: sk.read(_saved(t), progress=5), ("progress", "callable")),
    "save(progress=5)": (
        lambda t: sk.save(t / "r", {"x": 1}, step=1, progress=5),
        ("progress", "callable"),
    ),
    "generators=[g]": (
        lambda t: _ckpt(t, generators=[torch.Generator()]),
        ("generators", "mapping", "{'data': g}"),
    ),
    "generators={'x': 5}": (
        lambda t: _ckpt(t, generators={"x": 5}),
        ("generator 'x'", "torch.Generator"),
    ),
    "RNGState([g])": (lambda t: sk.RNGState([torch.Generator()]), ("generators", "mapping")),
    "maybe_save('x')": (
        _with_ckpt(lambda c: c.maybe_save("x", {"x": 1}), every=sk.EverySteps(1)),
        ("step", "int"),
    ),
    "Checkpointer.save(True)": (_with_ckpt(lambda c: c.save(True, {"x": 1})), ("step", "int")),
    "Checkpointer blocking='yes'": (
        lambda t: _ckpt(t, blocking="yes"),
        ("blocking", "True or False"),
    ),
    "blocking='no'": (
        lambda t: sk.save(t / "r", {"x": 1}, step=1, blocking="no"),
        ("blocking", "True or False"),
    ),
    "overwrite='yes'": (
        lambda t: sk.save(t / "r", {"x": 1}, step=1, overwrite="yes"),
        ("overwrite", "True or False"),
    ),
    "Checkpointer.save overwrite=1": (
        _with_ckpt(lambda c: c.save(1, {"x": 1}, overwrite=1)),
        ("overwrite", "True or False"),
    ),
    "average overwrite='yes'": (
        lambda t: sk.averaging.average_checkpoints([_saved(t)], t / "o", overwrite="yes"),
        ("overwrite", "True or False"),
    ),
    "convert overwrite='yes'": (
        lambda t: sk.conversion.convert(_saved(t), t / "o", overwrite="yes"),
        ("overwrite", "True or False"),
    ),
    "keep=3": (lambda t: _ckpt(t, keep=3), ("keep", "KeepLatest")),
    "AveragedModel(5)": (lambda t: sk.averaging.AveragedModel(5), ("model", "nn.Module")),
    "KeepLatest('3')": (lambda t: sk.KeepLatest("3"), ("KeepLatest(n)", "int")),
    "EverySteps(2.0)": (lambda t: sk.EverySteps(2.0), ("EverySteps(n)", "int")),
    "EverySeconds('60')": (lambda t: sk.EverySeconds("60"), ("EverySeconds",)),
    "EverySeconds(True)": (lambda t: sk.EverySeconds(True), ("EverySeconds",)),
    "AtSteps('5')": (lambda t: sk.AtSteps("5"), ("AtSteps", "int")),
    "shard_bytes='1MB'": (
        lambda t: sk.save(t / "r", {"x": 1}, step=1, shard_bytes="1MB"),
        ("shard_bytes", "int"),
    ),
    "Checkpointer shard_bytes=True": (lambda t: _ckpt(t, shard_bytes=True), ("shard_bytes",)),
    "save origin='minimal'": (
        lambda t: sk.save(t / "r", {"x": 1}, step=1, origin="minimal"),
        ("origin", "statekeeper.training.Origin"),
    ),
    "Checkpointer origin='full'": (lambda t: _ckpt(t, origin="full"), ("origin", "Origin")),
    "every=10": (lambda t: _ckpt(t, every=10), ("every", "EverySteps")),
    "scope='local'": (lambda t: sk.save(t / "r", {"x": 1}, step=1, scope="local"), ("scope",)),
    "strict=True": (
        lambda t: sk.load(_saved(t), {"x": torch.zeros(2)}, strict=True),
        ("strict", "Strict"),
    ),
    "Mirror(5)": (lambda t: sk.Mirror(5), ("Mirror directory", "s3://bucket/run")),
    "Mirror(keep=3)": (
        lambda t: sk.Mirror(str(t / "m"), keep=3),
        ("Mirror keep", "KeepEvery(10)"),
    ),
    "Mirror(timeout='5')": (
        lambda t: sk.Mirror(str(t / "m"), timeout="5"),
        ("Mirror timeout", "seconds"),
    ),
    "Mirror(close_timeout=True)": (
        lambda t: sk.Mirror(str(t / "m"), close_timeout=True),
        ("Mirror close_timeout", "None"),
    ),
    "Mirror(retries=2.0)": (
        lambda t: sk.Mirror(str(t / "m"), retries=2.0),
        ("Mirror retries", "int"),
    ),
    "Mirror(concurrency=True)": (
        lambda t: sk.Mirror(str(t / "m"), concurrency=True),
        ("Mirror concurrency", "int"),
    ),
    "Checkpointer mirror='s3://...'": (
        lambda t: _ckpt(t, mirror="s3://bucket/run"),
        ("mirror", "statekeeper.Mirror("),
    ),
    "export overwrite='no'": (
        lambda t: sk.conversion.export(_saved(t), t / "o.safetensors", overwrite="no"),
        ("overwrite", "True or False"),
    ),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES), ids=list(WRONG_TYPES))
def test_an_argument_of_the_wrong_type_is_named_as_a_type_error(tmp_path: Path, case: str) -> None:
    call, words = WRONG_TYPES[case]
    with pytest.raises(sk.errors.InvalidArgumentTypeError) as caught:
        call(tmp_path)
    assert isinstance(caught.value, TypeError) and isinstance(
        caught.value, sk.errors.InvalidArgumentError
    )
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def _nested() -> torch.Tensor:
    with pytest.warns(UserWarning, match="nested"):  # torch: the API is a prototype
        return torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])


UNSTORABLE: dict[str, tuple[Callable[[], Any], str]] = {
    "meta tensor": (lambda: torch.zeros(3, device="meta"), "materialize"),
    "sparse COO": (lambda: torch.eye(3).to_sparse(), "to_dense()"),
    "sparse CSR": (lambda: torch.eye(3).to_sparse_csr(), "to_dense()"),  # torch warns: beta
    "nested tensor": (_nested, "unbind()"),
    "big-endian numpy array": (lambda: np.arange(3, dtype=">i4"), "newbyteorder"),
}


@pytest.mark.parametrize("case", list(UNSTORABLE), ids=list(UNSTORABLE))
def test_a_tensor_without_storable_bytes_is_refused_with_its_key_path(
    tmp_path: Path, case: str
) -> None:
    make, fix = UNSTORABLE[case]
    with pytest.raises(sk.errors.UnsupportedValueError) as caught:
        sk.save(tmp_path / "run", {"model": {"layer": {"w": make()}}}, step=1)
    assert isinstance(caught.value, TypeError)
    assert "model/layer/w" in str(caught.value) and fix in str(caught.value)
    assert caught.value.key_path == "model/layer/w"
    assert not (tmp_path / "run").exists() or sk.list_checkpoints(tmp_path / "run") == []


def test_a_path_under_a_regular_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    where = tmp_path / "notes.txt" / "run"
    for call in (lambda: sk.save(where, {"x": 1}, step=1), lambda: sk.Checkpointer(where)):
        with pytest.raises(sk.errors.StorageError) as caught:
            call()
        assert caught.value.errno == errno.ENOTDIR
        assert f"{tmp_path / 'notes.txt'} is a regular file" in str(caught.value)


def test_a_name_longer_than_the_file_system_allows_is_named(tmp_path: Path) -> None:
    where = tmp_path / ("a" * 300)
    calls = [
        lambda: sk.save(where, {"x": 1}, step=1),
        lambda: sk.Checkpointer(where),
        lambda: sk.load(where, {"x": 1}),
        lambda: sk.list_checkpoints(where),
        lambda: sk.audit.verify(where),
        lambda: sk.read(where),
    ]
    for call in calls:
        with pytest.raises(sk.errors.StorageError) as caught:
            call()
        assert caught.value.errno == errno.ENAMETOOLONG
        assert "300 bytes long" in str(caught.value) and "shorter" in str(caught.value)


def test_an_empty_path_is_refused_not_taken_as_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    where = ""  # (Path("") is Path("."): the current directory, said explicitly)
    calls = [
        lambda: sk.save(where, {"x": 1}, step=1),
        lambda: sk.Checkpointer(where),
        lambda: sk.load(where, {"x": 1}),
        lambda: sk.read(where),
        lambda: sk.audit.verify(where),
        lambda: sk.list_checkpoints(where),
    ]
    for call in calls:
        with pytest.raises(sk.errors.InvalidArgumentError, match="empty"):
            call()
    assert list(tmp_path.iterdir()) == []  # nothing was written into the current directory


def test_a_path_with_a_nul_byte_is_named(tmp_path: Path) -> None:
    where = str(tmp_path / "run\0x")
    calls = [
        lambda: sk.save(where, {"x": 1}, step=1),
        lambda: sk.Checkpointer(where),
        lambda: sk.load(where, {"x": 1}),
        lambda: sk.read(where),
        lambda: sk.audit.verify(where),
        lambda: sk.list_checkpoints(where),
    ]
    for call in calls:
        with pytest.raises(sk.errors.InvalidArgumentError, match="NUL byte"):
            call()
    assert list(tmp_path.iterdir()) == []


@contextlib.contextmanager
def _read_only(root: Path) -> Iterator[Path]:
    """A real read-only file system mounted at ``root/ro`` (tmpfs, as root), unmounted after."""
    target = root / "ro"
    target.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)],
        capture_output=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"cannot mount a read-only tmpfs here: {done.stderr!r}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_read_only_file_system_is_named_with_the_fix(tmp_path: Path) -> None:
    with _read_only(tmp_path) as ro:
        for call in (
            lambda: sk.Checkpointer(ro / "run"),
            lambda: sk.Checkpointer(ro),
            lambda: sk.save(ro / "run", {"x": 1}, step=1),
        ):
            with pytest.raises(sk.errors.StorageError) as caught:
                call()
            assert caught.value.errno == errno.EROFS
            assert "read-only file system" in str(caught.value)
            assert "writable directory" in str(caught.value)


def test_numpy_scalars_and_one_element_tensors_are_metrics(tmp_path: Path) -> None:
    metrics = {
        "np32": np.float32(1.5),
        "np64": np.float64(0.25),
        "npint": np.int64(7),
        "tensor": torch.tensor(2.5),
    }
    sk.save(tmp_path, {"x": 1}, step=1, metrics=metrics)
    [info] = sk.list_checkpoints(tmp_path)
    assert info.metrics == {"np32": 1.5, "np64": 0.25, "npint": 7, "tensor": 2.5}
    with sk.Checkpointer(tmp_path / "k", keep=sk.KeepBest(1, metric="loss")) as ckpt:
        ckpt.save(1, {"x": 1}, {"loss": np.float32(0.5)})
        ckpt.save(2, {"x": 1}, {"loss": np.float32(0.25)})
        ckpt.save(3, {"x": 1}, {"loss": np.float32(0.75)})
    assert [c.step for c in sk.list_checkpoints(tmp_path / "k")] == [2, 3]  # best + newest


@pytest.fixture
def default_int_digits() -> Iterator[None]:
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(sys.int_info.default_max_str_digits)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(before)


BIG = 7 * 10**4999 + 12345  # 5000 decimal digits


@pytest.mark.usefixtures("default_int_digits")
def test_an_int_of_any_size_reads_back_in_a_default_process(tmp_path: Path) -> None:
    values = {"big": BIG, "neg": -BIG, "edge": 10**4300 - 1, "over": 10**4300}
    sk.save(tmp_path, dict(values), step=1)
    loaded: dict[str, Any] = dict.fromkeys(values)
    sk.load(tmp_path, loaded)
    assert loaded == values
    assert sk.audit.verify(tmp_path).ok


@pytest.mark.usefixtures("default_int_digits")
def test_a_long_int_saved_after_raising_the_limit_reads_back_in_a_default_process(
    tmp_path: Path,
) -> None:
    sys.set_int_max_str_digits(0)  # the saving process raised the limit
    with sk.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"big": BIG})
    sys.set_int_max_str_digits(sys.int_info.default_max_str_digits)
    assert sk.read(tmp_path)["big"] == BIG  # read in a process at the default limit
    with sk.Checkpointer(tmp_path) as ckpt:  # not damaged: the run resumes from it
        state: dict[str, Any] = {"big": None}
        assert ckpt.restore_latest(state) == 1 and state["big"] == BIG


@pytest.mark.usefixtures("default_int_digits")
def test_a_long_decimal_int_of_an_older_writer_reads_back(tmp_path: Path) -> None:
    """Older writers stored every int in decimal (one saved after
    ``sys.set_int_max_str_digits`` could hold 5000 digits): such a step is not damaged."""
    placeholder = 10**4000 + 1
    sk.save(tmp_path, {"big": placeholder}, step=1)
    sys.set_int_max_str_digits(0)
    old, new = str(placeholder), str(BIG)
    rewrite_manifest(tmp_path / "step_000000001", lambda text: text.replace(old, new))
    sys.set_int_max_str_digits(sys.int_info.default_max_str_digits)
    loaded: dict[str, Any] = {"big": None}
    sk.load(tmp_path, loaded)
    assert loaded["big"] == BIG
    assert sk.audit.verify(tmp_path).ok


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _arithmetic(tmp: Path, count: int) -> int:
    """Tensor operations other than allocation that averaging a step of ``count`` empty
    tensors (and one real one) runs."""
    tensors = {f"t{i}": torch.empty(0, 3) for i in range(count)}
    run = tmp / f"run{count}"
    sk.save(run, {"model": tensors, "w": torch.ones(3)}, step=1)
    with _Ops() as ops:
        info = sk.averaging.average_checkpoints([run, run], tmp / f"out{count}")
    averaged = sk.read(info.path)
    assert averaged["model"].keys() == tensors.keys()
    assert all(t.shape == (0, 3) and t.dtype == torch.float32 for t in averaged["model"].values())
    assert torch.equal(averaged["w"], torch.ones(3))
    return sum(n for op, n in ops.seen.items() if not op.startswith("aten.empty"))


def test_averaging_empty_tensors_costs_no_arithmetic_per_tensor(tmp_path: Path) -> None:
    assert _arithmetic(tmp_path, 100) == _arithmetic(tmp_path, 300)
