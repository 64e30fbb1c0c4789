"""What a child forked by the fork server (zygote.py) does to become the program asked for.

``become`` gives it the request's stdin/stdout/stderr, working directory, environment, argv,
``sys.path`` and a fresh ``__main__``, draws new random seeds as a new interpreter would, runs
``-m MODULE``, ``-c CODE`` or a script, and ends the process the way the interpreter ends it.
It never returns.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib
import importlib.util
import os
import random
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from typing import Any

__all__ = ["become"]


def _sys_path(first: str, pythonpath: str, base: list[str]) -> list[str]:
    """sys.path as a fresh interpreter builds it: the entry for -m/-c/the script, PYTHONPATH
    (absolute, duplicates dropped as site does), then the installation's own entries."""
    out = [first]
    seen: set[str] = set()
    extra = [os.path.abspath(p) for p in pythonpath.split(os.pathsep)] if pythonpath else []
    for entry in [*extra, *base]:
        if entry not in seen:
            seen.add(entry)
            out.append(entry)
    return out


def _fresh_seeds() -> None:
    """What a fresh interpreter would have drawn from the OS at import."""
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    tempfile.tempdir = None  # computed again from this child's environment
    if "multiprocessing.process" in sys.modules:  # drawn at its import, like the seeds
        sys.modules["multiprocessing.process"].current_process().authkey = os.urandom(32)


def become(
    request: dict[str, Any], fds: list[int], base_path: list[str], set_by_imports: dict[str, str]
) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    if os.isatty(1):
        sys.stdout.reconfigure(line_buffering=True)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(set_by_imports)  # what the preloaded modules set, unless asked otherwise
    os.environ.update(request["env"])
    argv: list[str] = request["argv"]
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __loader__=None, __spec__=None)
    sys.modules["__main__"] = main
    if argv[0] == "-m":
        first = os.getcwd()
    elif argv[0] == "-c":
        first = ""
    else:
        first = os.path.dirname(os.path.realpath(argv[0]))
    sys.path[:] = _sys_path(first, request["env"].get("PYTHONPATH", ""), base_path)
    _fresh_seeds()
    if request["fork_children"]:
        _fork_children(*request["fork_children"])
    if request["preexec"]:  # Popen's preexec_fn, by reference: just before the program
        module, _, name = request["preexec"].partition(":")
        getattr(importlib.import_module(module), name)()
    code = _run(argv, main)
    _finish(code)


def _fork_children(launcher_file: str, session: str, owner: int) -> None:
    """Make this child's ``subprocess`` ask the fork servers for its own Python children."""
    spec = importlib.util.spec_from_file_location("_statekeeper_test_launcher", launcher_file)
    assert spec is not None and spec.loader is not None
    launcher = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = launcher
    spec.loader.exec_module(launcher)
    # (typing) the launcher's module state, pinned in the forked child
    launcher._pinned = (session, owner)  # type: ignore[attr-defined]
    subprocess.Popen = launcher.Popen  # run/call/... use it too


def _run(argv: list[str], main: types.ModuleType) -> int:
    """Run the program as the interpreter would; its exit status."""
    try:
        if argv[0] == "-m":
            sys.argv = ["-m", *argv[2:]]
            # (typing) a private CPython hook: what `python -m` and interpreter exit run
            runpy._run_module_as_main(argv[1])  # type: ignore[attr-defined]  # what -m runs
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = list(argv)
            main.__file__ = argv[0]
            main.__dict__["__cached__"] = None
            with open(argv[0], "rb") as f:
                source = f.read()
            exec(compile(source, argv[0], "exec"), main.__dict__)
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # the traceback starts where a fresh interpreter's would
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        if isinstance(exc, KeyboardInterrupt):
            _finish(None)
        return 1
    return 0


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with contextlib.suppress(Exception):
        print(exc.code, file=sys.stderr)
    return 1


def _finish(code: int | None) -> None:
    """End as an interpreter does: join threads, run atexit, flush; None: die by SIGINT."""
    try:
        # (typing) a private CPython hook: what `python -m` and interpreter exit run
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    try:
        sys.stdout.flush()
    except Exception:
        code = 120 if code is not None else code
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    if code is None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    os._exit(code)
