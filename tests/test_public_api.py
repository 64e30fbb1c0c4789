"""The public API is exactly statekeeper.__all__, and the layering rules hold."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import mypy.api
import pytest

import statekeeper as sk

SRC = Path(sk.__file__).parent

ROOT = {
    "__version__",
    # saving and resuming
    "save", "load", "read", "Checkpointer", "list_checkpoints", "CheckpointInfo", "RestoreInfo",
    "Strict", "Scope", "Incremental", "Mirror",
    # when to save, what to keep
    "EverySteps", "EverySeconds", "AtSteps", "OnSignal",
    "KeepLatest", "KeepBest", "KeepEvery", "MetricGoal",
    # what goes into the state besides modules and optimizers
    "Stateful", "Value", "RNGState",
    # the errors a training loop catches (all of them are in sk.errors)
    "StatekeeperError", "StatekeeperWarning", "StepNotFoundError", "CorruptCheckpointError",
    "KeyMismatchError",
}  # fmt: skip

NAMESPACES = {
    "errors": {
        "StatekeeperError", "StatekeeperWarning", "CheckpointUnreadableError",
        "StateMismatchError", "LocationError", "CorruptCheckpointError",
        "UnsupportedFormatError", "UnsafePickleError", "KeyMismatchError", "LoadStateError",
        "UnsupportedValueError", "StepNotFoundError", "StepExistsError", "WriterConflictError",
        "StorageError", "MirrorError", "InvalidArgumentError", "InvalidArgumentTypeError",
        "RankFailure", "OutputExistsError",
    },
    "training": {
        "SavePolicy", "Retention", "Origin", "OptimizerChange", "MirrorStatus",
        "RetentionStatus", "PendingRemoval", "Progress", "PendingSave",
    },
    "audit": {
        "inspect", "verify", "list_partial", "remove_partial", "InspectReport", "StepVerifyReport",
        "VerifyReport", "ForeignReport", "diff", "DiffReport", "TiedKeys", "ParsedEntry",
        "EntryKind",
    },
    "conversion": {"convert", "ConvertReport", "export", "ExportReport"},
    "clearing": {
        "clear_state", "register_clear_rule", "ClearReport", "Cleared", "ClearAction",
        "ClearMode", "ClearInclude",
    },
    "averaging": {
        "AveragedModel", "BufferPolicy", "update_bn", "AveragingRule", "EMA", "SWA",
        "get_ema_avg_fn", "get_ema_multi_avg_fn", "get_swa_avg_fn", "get_swa_multi_avg_fn",
        "average_checkpoints",
    },
    "data": {
        "ResumableSampler", "ResumableBatchSampler", "ResumableLoader", "SeededDataset",
        "WorkerRNGDataset",
    },
    "distributed": {"PerRank"},
    "storage": {
        "Storage", "SharedStorage", "Transaction", "LocalStorage", "MemoryStorage",
        "InjectedFailure", "FsspecStorage",
    },
    "testing": {
        "Run", "assert_resumes_exactly", "assert_checkpoint_safe", "assert_state_equal",
        "first_difference",
    },
    "doctor": {"run", "Report", "Finding", "Severity"},
}  # fmt: skip
REPO = SRC.parents[1]


def test_the_root_holds_what_a_training_loop_needs() -> None:
    assert set(sk.__all__) == ROOT
    assert len(sk.__all__) == len(set(sk.__all__))
    for name in sk.__all__:
        assert hasattr(sk, name), name


def test_each_namespace_is_a_module_with_its_own_all() -> None:
    for name, expected in NAMESPACES.items():
        namespace = getattr(sk, name)  # no import statement: the root loads it
        assert isinstance(namespace, types.ModuleType), name
        assert namespace.__name__ == f"statekeeper.{name}"
        assert set(namespace.__all__) == expected, name
        assert len(namespace.__all__) == len(set(namespace.__all__)), name
        for public in namespace.__all__:
            assert hasattr(namespace, public), f"sk.{name}.{public}"
    assert set(sk.__dir__()) >= ROOT | set(NAMESPACES)


def test_a_namespace_name_stays_itself_when_a_module_of_that_name_is_imported() -> None:
    """``statekeeper.interop.diff`` is a module and ``sk.audit.diff`` a function: importing
    the module (the CLI does) must not change what a namespace hands out."""
    import statekeeper.doctor.run
    import statekeeper.interop.convert
    import statekeeper.interop.diff
    import statekeeper.interop.export

    assert isinstance(statekeeper.interop.diff, types.ModuleType)
    for name in NAMESPACES:
        namespace = getattr(sk, name)
        for public in namespace.__all__:
            assert not isinstance(getattr(namespace, public), types.ModuleType), (name, public)
    assert callable(sk.audit.diff) and callable(sk.conversion.convert) and callable(sk.doctor.run)


def test_public_names_not_in_all_are_modules_only() -> None:
    extra = {n for n in vars(sk) if not n.startswith("_") and n not in sk.__all__}
    assert {n for n in extra if not isinstance(getattr(sk, n), types.ModuleType)} == {"annotations"}


def test_a_root_name_is_in_no_namespace_but_the_errors() -> None:
    """One home per name: the errors caught most are at the root too, as the same class."""
    for name, names in NAMESPACES.items():
        shared = ROOT & names
        if name == "errors":
            for error in shared:
                assert getattr(sk, error) is getattr(sk.errors, error)
        else:
            assert not shared, (name, shared)


def test_names_moved_off_the_root_are_gone_from_it() -> None:
    for name in ("clear_state", "Storage", "verify", "diff", "AveragedModel", "Mode", "Origin"):
        assert not hasattr(sk, name), name
        with pytest.raises(AttributeError, match=name):
            getattr(sk, name)


def test_all_and_the_lazy_tables_are_generated_from_the_imports() -> None:
    """__all__ and _EXPORTS are scripts/public_api.py's output from the TYPE_CHECKING
    imports (or a namespace's imports): an import added without running it fails here."""
    spec = importlib.util.spec_from_file_location("public_api", REPO / "scripts" / "public_api.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for module in script.MODULES:
        source = (SRC / module).read_text()
        assert script.rewrite(source) == source, f"run scripts/public_api.py ({module} is stale)"
    # and the script would notice: a name added to the import block goes into both tables
    root = (SRC / "__init__.py").read_text()
    added = root.replace("    from statekeeper.checkpoint.save import save\n",
                         "    from statekeeper.checkpoint.save import save\n"
                         "    from statekeeper.checkpoint.save import Extra\n")  # fmt: skip
    regenerated = script.rewrite(added)
    assert '"Extra": "statekeeper.checkpoint.save"' in regenerated
    assert '    "Extra",\n' in regenerated
    assert set(sk._EXPORTS) | {"__version__"} == set(sk.__all__)
    assert set(sk._NAMESPACES) == set(NAMESPACES)


def test_import_statekeeper_loads_no_namespace_and_no_torch() -> None:
    """A fresh interpreter (not the launcher's, which has torch imported already)."""
    code = (
        "import sys, statekeeper as sk\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith("
        "('statekeeper.clearing', 'statekeeper.averaging', 'statekeeper.audit', "
        "'statekeeper.training', 'statekeeper.conversion', 'statekeeper.testing')))\n"
        "assert not loaded, loaded\n"
        "sk.storage.LocalStorage, sk.errors.MirrorError\n"
        "assert 'torch' not in sys.modules\n"
        "sk.clearing.clear_state\n"
        "assert 'torch' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_type_checkers_see_every_root_and_namespace_name(tmp_path: Path) -> None:
    """mypy --strict on a user's script: the root's names and the namespaces are seen with
    their real signatures (the lazy ``__getattr__`` is hidden from type checkers, so a name
    that is not there, or a wrong argument, is an error)."""
    good = tmp_path / "good.py"
    good.write_text(
        "import torch\n"
        "import statekeeper as sk\n"
        "model = torch.nn.Linear(2, 2)\n"
        "info: sk.CheckpointInfo = sk.save('run', {'model': model}, step=1)\n"
        "restored: sk.RestoreInfo = sk.load('run', {'model': model})\n"
        "report = sk.clearing.ClearReport()\n"
        "cleared: torch.nn.Linear = sk.clearing.clear_state(model, report=report)\n"
        "keep = sk.KeepBest(2, metric='loss', mode=sk.MetricGoal.MAX) | sk.KeepLatest(1)\n"
        "retention: sk.training.Retention = keep\n"
        "ckpt = sk.Checkpointer('run', keep=keep, every=sk.EverySteps(10))\n"
        "error: type[sk.errors.StorageError] = sk.errors.MirrorError\n"
        "storage: sk.storage.Storage = sk.storage.MemoryStorage()\n"
        "loader = sk.data.ResumableLoader\n"
        "verified: sk.audit.VerifyReport = sk.audit.verify('run')\n"
        "ema = sk.averaging.AveragedModel(model, rule=sk.averaging.EMA(0.99))\n"
        "tied = sk.audit.TiedKeys\n"
        "export = sk.conversion.export\n"
        "problems = sk.doctor.run\n"
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import statekeeper as sk\n"
        "sk.clear_state\n"  # moved to sk.clearing
        "sk.save('run', {}, stepp=1)\n"  # no such keyword
        "sk.clearing.clear_stat\n"
    )
    cache = ["--cache-dir", str(REPO / ".mypy_cache")]
    out, err, status = mypy.api.run(["--strict", *cache, str(good)])
    assert status == 0, out + err
    out, err, status = mypy.api.run(["--strict", *cache, str(bad)])
    assert status == 1, out + err
    assert 'Module has no attribute "clear_state"' in out, out
    assert '"stepp"' in out, out
    assert 'has no attribute "clear_stat"' in out, out


def _documented(pages: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for page in sorted(pages.glob("*.md")):
        for name in re.findall(r"^::: (statekeeper[\w.]*)\s*$", page.read_text(), re.MULTILINE):
            found.setdefault(name, []).append(page.name)
    return found


def test_each_public_name_is_documented_exactly_once() -> None:
    """Under docs/reference/, by its namespace (a root error under sk.errors)."""
    expected = {f"statekeeper.{ns}.{name}" for ns, names in NAMESPACES.items() for name in names}
    expected |= {f"statekeeper.{name}" for name in ROOT - NAMESPACES["errors"] - {"__version__"}}
    found = _documented(REPO / "docs" / "reference")
    public = {name: pages for name, pages in found.items() if name in expected}
    assert sorted(expected - public.keys()) == []
    assert {name: pages for name, pages in public.items() if len(pages) > 1} == {}
    unknown = {
        n for n in found if n not in expected and not n.startswith("statekeeper.integrations")
    }
    assert unknown == set(), "documented but not public (or documented by its old name)"


def test_every_error_derives_from_the_root_and_a_builtin() -> None:
    errors = [getattr(sk.errors, n) for n in sk.errors.__all__ if n.endswith(("Error", "Failure"))]
    for err in errors:
        assert issubclass(err, sk.StatekeeperError)
        if err is not sk.StatekeeperError:
            assert any(b.__module__ == "builtins" and b is not Exception for b in err.__mro__), err
    assert issubclass(sk.StepNotFoundError, FileNotFoundError)
    assert issubclass(sk.errors.StepExistsError, FileExistsError)
    assert issubclass(sk.CorruptCheckpointError, ValueError)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_storage_layer_never_imports_torch() -> None:
    for path in (SRC / "storage").glob("*.py"):
        assert "torch" not in _imports(path), path


def test_library_code_never_prints_or_pickles() -> None:
    for path in SRC.rglob("*.py"):
        if path.parent.name == "cli" and path.name == "render.py":
            continue
        tree = ast.parse(path.read_text())
        calls = {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        assert "print" not in calls, path
        imported = _imports(path)
        if path.relative_to(SRC).as_posix() == "interop/unpickler.py":
            imported -= {
                "pickle"
            }  # the allow-list Unpickler (tests/interop/test_restricted_unpickler.py)
        assert not {"pickle", "dill", "cloudpickle"} & imported, path
        text = path.read_text().replace("safetensors.torch.load", "")
        if path.relative_to(SRC).as_posix() == "interop/pickled.py":
            continue  # the one place torch.load is called: checked below
        assert "torch.load(" not in text, path


def test_torch_load_is_only_ever_weights_only() -> None:
    """Foreign pickle files are opened in one module, always with weights_only=True."""
    tree = ast.parse((SRC / "interop" / "pickled.py").read_text())
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "load"
    ]
    assert calls
    for call in calls:
        options = {k.arg: k.value for k in call.keywords}
        assert isinstance(options.get("weights_only"), ast.Constant), ast.unparse(call)
        flag = options["weights_only"]
        assert isinstance(flag, ast.Constant) and flag.value is True, ast.unparse(call)
