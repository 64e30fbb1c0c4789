"""The error tree's middle layer: each error is caught by its kind and by its builtin."""

from __future__ import annotations

import errno
import importlib
import pickle
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

import statekeeper as sk
from statekeeper import errors
from statekeeper.errors import error_class, error_kinds


@pytest.mark.parametrize(
    ("error", "kind", "builtin"),
    [
        (sk.CorruptCheckpointError("p", "x"), sk.errors.CheckpointUnreadableError, ValueError),
        (
            sk.errors.UnsupportedFormatError("p", 9, [1]),
            sk.errors.CheckpointUnreadableError,
            ValueError,
        ),
        (
            sk.errors.UnsafePickleError("p", ["os.system"]),
            sk.errors.CheckpointUnreadableError,
            ValueError,
        ),
        (sk.KeyMismatchError(["a"]), sk.errors.StateMismatchError, KeyError),
        (sk.errors.LoadStateError("x"), sk.errors.StateMismatchError, RuntimeError),
        (sk.StepNotFoundError("x"), sk.errors.LocationError, FileNotFoundError),
        (sk.errors.StepExistsError("x", path="p"), sk.errors.LocationError, FileExistsError),
        (sk.errors.OutputExistsError("x", path="p"), sk.errors.LocationError, FileExistsError),
        (sk.errors.WriterConflictError("x"), sk.errors.LocationError, BlockingIOError),
        (sk.errors.StorageError(errno.ENOSPC, "full"), sk.errors.LocationError, OSError),
    ],
)
def test_every_error_has_a_kind_and_a_builtin(
    error: Exception, kind: type[Exception], builtin: type[Exception]
) -> None:
    assert isinstance(error, kind) and isinstance(error, builtin)
    assert isinstance(error, sk.StatekeeperError)
    assert error_class(type(error).__name__) is type(error)


def test_error_class_knows_only_statekeeper_errors() -> None:
    assert error_class("ValueError") is None and error_class("nope") is None
    assert sk.errors.StorageError(errno.ENOSPC, "full").errno == errno.ENOSPC


def test_rank_failure_names_and_types_its_causes() -> None:
    failure = sk.errors.RankFailure("rank 1 failed", ["CorruptCheckpointError", "KeyError"])
    assert failure.causes == (sk.CorruptCheckpointError, None)
    assert error_kinds(failure) == ("CorruptCheckpointError", "KeyError")
    assert error_kinds(sk.StepNotFoundError("gone")) == ("StepNotFoundError",)


def test_every_error_survives_a_trip_through_pickle() -> None:
    """torch.distributed gathers a rank's error with pickle: an error whose __init__ takes
    other arguments than its message must still come back whole (the other ranks would
    otherwise fail with a TypeError instead of reporting it)."""
    made = [
        errors.CorruptCheckpointError("/run/step_000000001/tensors-00000.safetensors", "short"),
        errors.UnsupportedFormatError("/run", 9, [1, 2]),
        errors.KeyMismatchError(["model/w: missing"], "rebuild the model"),
        errors.StepExistsError("step 3 exists", "/run/step_000000003"),
    ]
    for error in made:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert back.__dict__ == error.__dict__


# the drawn tree ----------------------------------------------------------------------------------

_ROOT = Path(__file__).resolve().parents[1]
_SRC = _ROOT / "src" / "statekeeper"
_NODE = re.compile(
    r"(?P<prefix>(?:[│ ]   )*)(?P<branch>[├└]── )?(?P<name>\w+)(?: \((?P<bases>[\w, ]+)\))?"
)


def _drawn(text: str) -> dict[str, tuple[str | None, frozenset[str]]]:
    """Each class drawn in ``text``: its drawn parent (None for a root) and the builtins
    named in parentheses."""
    drawn: dict[str, tuple[str | None, frozenset[str]]] = {}
    parents: list[str] = []
    for line in text.splitlines():
        match = _NODE.match(line)
        if not line.strip() or match is None:
            continue
        depth = len(match["prefix"]) // 4 + (1 if match["branch"] else 0)
        del parents[depth:]
        bases = frozenset(b.strip() for b in (match["bases"] or "").split(",") if b.strip())
        assert match["name"] not in drawn, f"{match['name']} is drawn twice"
        drawn[match["name"]] = (parents[-1] if parents else None, bases)
        parents.append(match["name"])
    return drawn


def _drawings() -> dict[str, str]:
    doc = errors.__doc__ or ""
    block = doc[doc.index("::\n") + 3 : doc.index("\nCode branches")]
    page = (_ROOT / "docs" / "reference" / "errors.md").read_text()
    fenced = page[page.index("```text\n") + 8 :]
    return {
        "errors.py": textwrap.dedent(block),
        "docs/reference/errors.md": fenced[: fenced.index("\n```")],
    }


def _every_class() -> dict[str, type[BaseException]]:
    """Every statekeeper error and warning class, wherever in the package it is defined (the
    modules that define a class of that look are imported first)."""
    defines = re.compile(r"^class \w+\([\w., ]*(Error|Warning|Failure)\b", re.MULTILINE)
    for path in sorted(_SRC.rglob("*.py")):
        if defines.search(path.read_text()):
            module = ".".join(path.relative_to(_SRC.parent).with_suffix("").parts)
            importlib.import_module(module.removesuffix(".__init__"))
    found: dict[str, type[BaseException]] = {}
    todo: list[type[BaseException]] = [sk.StatekeeperError, sk.StatekeeperWarning]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("statekeeper."):
            assert found.setdefault(cls.__name__, cls) is cls, f"two classes {cls.__name__}"
            todo += cls.__subclasses__()
    return found


@pytest.mark.parametrize("where", ["errors.py", "docs/reference/errors.md"])
def test_the_drawn_tree_is_the_class_hierarchy(where: str) -> None:
    """Every error and warning class is drawn once, under its statekeeper base, with its
    builtin bases: a class added, moved or re-based without the drawing fails here."""
    drawn = _drawings()[where]
    classes = _every_class()
    actual = {}
    for name, cls in classes.items():
        ours = [b.__name__ for b in cls.__bases__ if b.__module__.startswith("statekeeper.")]
        builtins = {
            b.__name__ for b in cls.__bases__ if not b.__module__.startswith("statekeeper.")
        }
        assert len(ours) <= 1, f"{name} has several statekeeper bases: {ours}"
        actual[name] = (ours[0] if ours else None, frozenset(builtins - {"Exception"}))
    assert sorted(set(classes) - set(_drawn(drawn))) == [], f"not drawn in {where}"
    assert sorted(set(_drawn(drawn)) - set(classes)) == [], f"drawn in {where}, not classes"
    assert _drawn(drawn) == actual


def test_an_output_that_exists_is_a_file_exists_error() -> None:
    error = sk.errors.OutputExistsError("/out/w.safetensors: exists", "/out/w.safetensors")
    assert isinstance(error, FileExistsError) and isinstance(error, sk.errors.LocationError)
    assert issubclass(
        sk.errors.StepExistsError, sk.errors.OutputExistsError
    )  # except OutputExistsError: both
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is sk.errors.OutputExistsError and back.path == error.path


# conversion: damage is CorruptCheckpointError from its cause; a bug stays a bug ---------------


def _run(tmp_path: Path) -> Path:
    import torch

    sk.save(tmp_path / "run", {"model": {"w": torch.arange(6.0)}, "epoch": 3}, step=1)
    return tmp_path / "run"


def _foreign(tmp_path: Path) -> Path:
    import safetensors.torch
    import torch

    safetensors.torch.save_file({"w": torch.arange(6.0)}, tmp_path / "w.safetensors")
    return tmp_path / "w.safetensors"


@pytest.mark.parametrize(
    ("target", "make", "call"),
    [
        ("statekeeper.checkpoint.reader.unflatten", _run, sk.read),
        ("statekeeper.format.manifest._tensor_records", _run, sk.read),
        ("statekeeper.catalog.verify_step.decode_value", _run, sk.audit.verify),
        ("statekeeper.interop.safetensors_files.parse", _foreign, sk.read),
        (
            "statekeeper.averaging.shards.parse",
            _run,
            lambda p: sk.averaging.average_checkpoints([p], p),
        ),
    ],
    ids=["read-state", "manifest", "verify-state", "foreign-safetensors", "average-shard"],
)
@pytest.mark.parametrize("bug", [TypeError, RuntimeError])
def test_a_bug_while_reading_is_not_reported_as_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, make: Any, call: Any, bug: Any
) -> None:
    """A TypeError or RuntimeError out of statekeeper's own code (here: an internal made to
    raise one) surfaces as itself with its traceback, never as "the checkpoint is damaged"."""
    path = make(tmp_path)

    def broken(*args: object, **kwargs: object) -> None:
        raise bug("a bug in statekeeper")

    monkeypatch.setattr(target, broken)
    with pytest.raises(bug, match="a bug in statekeeper") as info:
        call(path)
    assert not isinstance(info.value, sk.StatekeeperError)


def test_damage_is_converted_once_with_its_cause(tmp_path: Path) -> None:
    """A malformed file is a CorruptCheckpointError naming it, raised from the format's own
    error (its message and traceback kept), not from None."""
    from statekeeper.format.malformed import FormatError

    path = _foreign(tmp_path)
    data = bytearray(path.read_bytes())
    data[8:9] = b"["  # the header's JSON no longer parses
    path.write_bytes(bytes(data))
    with pytest.raises(sk.CorruptCheckpointError) as info:
        sk.read(path)
    assert info.value.path == str(path) and "not a valid safetensors file" in str(info.value)
    cause = info.value.__cause__
    assert isinstance(cause, FormatError) and str(cause) in str(info.value)
    assert cause.__traceback__ is not None


def test_library_messages_name_arguments_not_command_line_flags() -> None:
    """The library advises ``overwrite=True``; only the CLI (which renders errors through
    ``cli.render.as_flags``) spells it ``--overwrite``."""
    import ast

    flag = re.compile(r"(?<![\w-])--[a-z]")
    found = []
    for path in sorted(_SRC.rglob("*.py")):
        if "cli" in path.relative_to(_SRC).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            is_warn = isinstance(node, ast.Call) and ast.unparse(node.func).endswith("warn")
            if not (isinstance(node, ast.Raise) or is_warn):
                continue
            for part in ast.walk(node):
                text = part.value if isinstance(part, ast.Constant) else None
                if isinstance(text, str) and flag.search(text):
                    found.append(f"{path.relative_to(_SRC)}:{getattr(part, 'lineno', 0)}: {text!r}")
    assert found == []
