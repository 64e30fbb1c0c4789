"""The layer contract: every import inside the package points down the layer map (never up,
never sideways, not even inside a function), and no two modules import each other.

    errors, progress, extensions, lanes  <  {storage, arguments}  <  format  <  catalog  <
    state  <  incremental  <  {checkpoint, clearing}  <  {loop, distributed}  <
    {averaging, interop, data, lazy}  <  {doctor, integrations, audit, training, conversion}  <
    testing  <  cli  <  __main__

``catalog`` reads what a checkpoint holds without torch (``test_the_catalog_needs_no_torch``).
``audit``, ``training`` and ``conversion`` are namespaces of the public API (``sk.audit``, ...)
that re-export lower layers; nothing in the package imports them.

The package root (``statekeeper/__init__.py``) is the one exception: it is the public facade
above every layer, loads names on first use, and hands the core its extensions.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import statekeeper as sk

SRC = Path(sk.__file__).parent

LAYERS: dict[str, int] = {
    "_version": 0,
    "errors": 0,
    "progress": 0,
    "extensions": 0,
    "lanes": 0,  # the long-lived worker threads of saves and loads
    "lazy": 8,  # the public modules' names loaded on first use (a dynamic import: not core)
    "storage": 1,
    "arguments": 1,
    "format": 2,
    "catalog": 3,  # reading what a checkpoint holds without torch: see TORCH_FREE
    "state": 4,
    "stateful": 4,
    "incremental": 5,  # reusing an earlier step's files: under the pipeline that asks
    "checkpoint": 6,
    "clearing": 6,  # clear_state: over state only, beside the checkpoint pipeline
    "loop": 7,  # the Checkpointer and its mirror, over the pipeline
    "distributed": 7,  # the job-wide pipeline, beside the loop (neither imports the other)
    "averaging": 8,
    "interop": 8,
    "data": 8,
    "doctor": 9,
    "integrations": 9,
    "audit": 9,  # the sk.audit namespace: catalog and interop re-exported
    "training": 9,  # the sk.training namespace
    "conversion": 9,  # the sk.conversion namespace
    "testing": 10,
    "cli": 11,
    "__main__": 12,  # `python -m statekeeper`: the command line, above cli
}
CORE = {name for name, layer in LAYERS.items() if layer <= LAYERS["checkpoint"]}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(("statekeeper", *parts)), path


KNOWN = {m for m, _ in _modules()}


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def _dynamic(node: ast.Call) -> bool:
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    return name in ("import_module", "__import__")


def _imported(module: str, path: Path) -> set[str]:
    """Every statekeeper module ``module`` imports, at any depth of its code (with the
    packages whose ``__init__`` such an import runs); a dynamic import in the core is
    reported as the pseudo-module ``<dynamic>``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # `from a import b`: the module a.b if there is one
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in KNOWN else base)
        elif isinstance(node, ast.Call) and _dynamic(node):
            args = node.args
            if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                name = args[0].value
                if name.startswith(".") and len(args) > 1 and isinstance(args[1], ast.Constant):
                    # (typing) an ast node the test has narrowed by its shape
                    name = f"{args[1].value}{name}"  # type: ignore[str-bytes-safe]
                found.add(name)
            if module.split(".")[1:2] and module.split(".")[1] in CORE:
                found.add("<dynamic>")
    own = set(_parents(module)) | {module}
    found |= {p for m in list(found) if m in KNOWN for p in _parents(m) if p not in own}
    return {m for m in found if (m in KNOWN or m == "<dynamic>") and m != module}


def _layer(module: str) -> tuple[str, int]:
    if module == "<dynamic>":  # the core never imports by name at run time
        return module, len(LAYERS)
    top = module.split(".")[1]
    return top, LAYERS[top]


GRAPH = {m: _imported(m, p) for m, p in _modules()}


def test_every_subpackage_and_top_module_has_a_layer() -> None:
    tops = {m.split(".")[1] for m in GRAPH if m != "statekeeper"}
    assert tops <= set(LAYERS), sorted(tops - set(LAYERS))


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, imports in graph.items():
        if module == "statekeeper":
            continue  # the facade
        top, layer = _layer(module)
        for target in imports:
            if target == "statekeeper":
                wrong.append(f"{module} imports the package root")
                continue
            other, other_layer = _layer(target)
            if other != top and other_layer >= layer:
                wrong.append(f"{module} (layer {top}) imports {target} (layer {other})")
    return sorted(wrong)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk of ``graph``."""
    edges = {
        m: {t for t in imports if t not in ("statekeeper", "<dynamic>")}
        for m, imports in graph.items()
    }
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


def test_imports_point_down_the_layer_map() -> None:
    wrong = upward_imports(GRAPH)
    assert not wrong, "\n".join(wrong)


def test_the_core_never_imports_the_layers_above_it() -> None:
    above = {"loop", "distributed", "interop", "doctor", "testing", "cli", "data", "averaging"}
    offenders = [
        f"{m} imports {t}"
        for m, imports in GRAPH.items()
        if m != "statekeeper" and m.split(".")[1] in CORE
        for t in imports
        if t.split(".")[1:2] and t.split(".")[1] in above
    ]
    assert not offenders, offenders


def test_no_import_cycles() -> None:
    """No module reaches itself through its imports, lazy ones included."""
    found = cycles(GRAPH)
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_the_checks_catch_what_they_forbid() -> None:
    """The contract is not vacuous: the graph holds the imports, and a made-up upward,
    sideways or root import, or a cycle, is reported."""
    assert "statekeeper.checkpoint.adapters" in GRAPH["statekeeper.checkpoint.load"]
    bad = {
        "statekeeper.checkpoint.save": {"statekeeper.distributed.save"},
        "statekeeper.data.loader": {"statekeeper.interop.reading"},
        "statekeeper.format.values": {"statekeeper"},
    }
    assert len(upward_imports(bad)) == 3
    assert upward_imports({"statekeeper.cli.main": {"statekeeper.checkpoint.save"}}) == []
    assert upward_imports({"statekeeper.checkpoint.save": {"<dynamic>"}}) != []
    loop = {
        "statekeeper.state.a": {"statekeeper.state.b"},
        "statekeeper.state.b": {"statekeeper.state.a"},
    }
    assert cycles(loop) == [["statekeeper.state.a", "statekeeper.state.b", "statekeeper.state.a"]]


def test_dynamic_and_relative_imports_are_seen(tmp_path: Path) -> None:
    code = (
        "import importlib\n"
        "from importlib import import_module\n"
        "def f(x):\n"
        "    import_module('.save', 'statekeeper.distributed')\n"
        "    __import__('statekeeper.interop.reading')\n"
        "    importlib.import_module('statekeeper.' + x)\n"
        "    from ..data import loader\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(code)
    seen = _imported("statekeeper.checkpoint.probe", path)
    assert {
        "statekeeper.distributed.save",
        "statekeeper.distributed",  # its __init__ runs first
        "statekeeper.interop.reading",
        "statekeeper.data.loader",
        "<dynamic>",
    } <= seen


HEAVY = ("torch", "numpy", "safetensors")  # what reading a checkpoint's records must not need


def heavy_imports(source: str, *, anywhere: bool) -> list[int]:
    """The lines of ``source`` that import torch, numpy or safetensors: at module level, or
    ``anywhere`` (inside functions too)."""
    tree = ast.parse(source)
    nodes = ast.walk(tree) if anywhere else iter(tree.body)
    lines = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(n.split(".")[0] in HEAVY for n in names):
            lines.append(node.lineno)
    return lines


def _closure(roots: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module not in seen and module in GRAPH:
            seen.add(module)
            todo.extend(GRAPH[module])
    return seen


def test_the_catalog_needs_no_torch() -> None:
    """``statekeeper ls``/``inspect``/``verify`` start without torch: no catalog module imports
    it (not even in a function), and nothing the catalog imports does so at module level
    (``format`` imports torch inside the functions that build tensors only)."""
    paths = dict(_modules())
    catalog = {m for m in GRAPH if m.split(".")[1:2] == ["catalog"]}
    assert len(catalog) > 10  # the package, not a typo in its name
    offenders = [
        f"{m}:{line}"
        for m in sorted(_closure(catalog))
        for line in heavy_imports(paths[m].read_text(), anywhere=m in catalog)
    ]
    assert not offenders, offenders


def test_the_torch_check_sees_imports() -> None:
    source = "import os\nimport torch.nn\n\ndef f():\n    from numpy import zeros\n"
    assert heavy_imports(source, anywhere=False) == [2]
    assert heavy_imports(source, anywhere=True) == [2, 5]
