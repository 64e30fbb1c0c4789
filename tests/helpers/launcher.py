"""Child Python processes for the tests, forked from pre-started interpreters.

Starting a fresh interpreter that imports torch costs seconds; the suite starts about two
hundred. :class:`Popen` (a ``subprocess.Popen``) and :func:`run` take the same arguments as
their ``subprocess`` namesakes, and when the command is ``[sys.executable, "-m", MODULE, ...]``,
``[sys.executable, "-c", CODE, ...]`` or ``[sys.executable, SCRIPT, ...]`` they ask a fork
server (tests/helpers/zygote.py) with torch already imported to fork the child instead. Each
server has one ``PYTHONHASHSEED`` (the child's environment picks the server: 0, 1, 2, 3,
or unset, one server for all children without a seed), and the pytest session's workers share
them. The child is a real process of its own: its pid can be signalled (``kill()`` is a real
SIGKILL), its exit status is its own (``-9`` after SIGKILL), its stdin/stdout/stderr, argv,
environment, working directory and ``sys.path`` are the ones asked for, and Python's, numpy's
and torch's random generators start from fresh OS entropy as in a new interpreter.

Anything the servers cannot reproduce exactly gets a fresh interpreter as before: other
interpreter options, ``shell``/``pass_fds``/user switching, a preexec_fn that is not a
module-level function, an environment that differs from the server's in a variable read at
start-up (``PYTHON*``, ``OMP_*``, ``LANG``...), a module that the server has imported.

``subprocess`` (this module's attribute) stands in for the ``subprocess`` module inside
library code that launches children itself (``statekeeper.testing``, the doctor's SK002):
tests/conftest.py puts it there for each test not marked ``fresh_interpreters``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import socket
import struct
import subprocess as _subprocess
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Popen", "fallbacks", "run", "subprocess"]

ROOT = Path(__file__).resolve().parents[2]
_ZYGOTE = Path(__file__).with_name("zygote.py")
_ENV = dict(os.environ)  # the servers' environment: the session's, as it started
_TMP = tempfile.gettempdir()  # before any test redirects it: every worker finds the same one
_RealPopen = _subprocess.Popen  # a child that forks its own replaces subprocess.Popen by ours
_sockets: dict[str, Path | None] = {}
_servers: list[_RealPopen[bytes]] = []
_pinned: tuple[str, int] | None = None  # (session dir, owner) in a child that forks its own
fallbacks: list[str] = []
"""Why each child of this process that could have been forked was started fresh instead."""


def _session_dir() -> Path:
    if _pinned is not None:
        return Path(_pinned[0])
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"solo-{os.getpid()}"
    base = _TMP if len(_TMP) < 40 else "/tmp"  # a unix socket's path has room for ~100 bytes
    path = Path(base, f"statekeeper-zygotes-{os.getuid()}-{run_id}")
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _owner() -> int:
    """The pytest session's process: the servers end with it (xdist workers' parent)."""
    if _pinned is not None:
        return _pinned[1]
    return os.getppid() if "PYTEST_XDIST_WORKER" in os.environ else os.getpid()


def _start(key: str, sock: Path) -> None:
    """Start the server for ``key``; return once it listens at ``sock`` (or has failed)."""
    env = {k: v for k, v in _ENV.items() if k not in ("PYTHONPATH", "PYTHONHASHSEED")}
    if key != "random":
        env["PYTHONHASHSEED"] = key
    log_path = sock.with_suffix(".log")
    with open(log_path, "wb") as log:
        server = _RealPopen(
            [sys.executable, str(_ZYGOTE), str(sock), str(_owner())],
            env=env, cwd=ROOT, stdin=_subprocess.DEVNULL, stdout=_subprocess.PIPE, stderr=log,
        )  # fmt: skip
    assert server.stdout is not None
    ready = server.stdout.readline() == b"ready\n"
    server.stdout.close()
    if ready:
        _servers.append(server)  # it runs on until the session ends
        return
    server.wait()
    log_text = log_path.read_text(errors="replace")[-2000:]
    warnings.warn(f"the fork server for PYTHONHASHSEED={key} failed:\n{log_text}", stacklevel=4)
    with contextlib.suppress(OSError):
        sock.unlink()


def _socket(key: str) -> Path | None:
    """The socket of the server for ``key`` (None: it failed), started on first use; the
    pytest workers share the servers."""
    if key not in _sockets:
        where = _session_dir()
        sock, failed = where / f"{key}.sock", where / f"{key}.failed"
        with open(where / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker starting it: wait, then share
            if not sock.exists() and not failed.exists():
                _start(key, sock)
                if not sock.exists():
                    failed.touch()
        _sockets[key] = sock if sock.exists() else None
    return _sockets[key]


def _hash_key(env: dict[str, str]) -> str | None:
    seed = env.get("PYTHONHASHSEED", "")
    if seed in ("", "random"):
        return "random"
    if seed.isdigit() and int(seed) <= 4294967295:
        return str(int(seed))
    return None


def _reference(func: Any) -> str | None:
    module, name = getattr(func, "__module__", None), getattr(func, "__qualname__", "")
    if not module or module == "__main__" or "." in name or "<" in name:
        return None
    return f"{module}:{name}"


def _request(
    args: Any, executable: Any, preexec_fn: Any, close_fds: bool, pass_fds: Sequence[int],
    cwd: Any, env: Any, shell: bool, gid: Any, gids: Any, uid: Any, umask: int,
    start_new_session: bool, process_group: int,
) -> tuple[str, dict[str, Any]] | None:  # fmt: skip
    """The server and the request for this Popen call, or None: a fresh interpreter."""
    options_ok = (
        not shell and executable is None and not pass_fds and close_fds and gid is None
        and gids is None and uid is None and umask == -1 and not start_new_session
        and process_group == -1
    )  # fmt: skip
    if not options_ok or isinstance(args, str | bytes | os.PathLike):
        return None
    argv = [os.fsdecode(a) for a in args]
    if len(argv) < 2 or argv[0] != sys.executable:
        return None
    if argv[1] in ("-m", "-c"):
        if len(argv) < 3:
            return None
    elif argv[1].startswith("-") or not os.path.isfile(argv[1]):
        return None
    preexec = None
    if preexec_fn is not None:
        preexec = _reference(preexec_fn)
        if preexec is None:
            return None
    environ = {
        os.fsdecode(k): os.fsdecode(v) for k, v in (os.environ if env is None else env).items()
    }
    key = _hash_key(environ)
    directory = os.path.abspath(os.getcwd() if cwd is None else os.fsdecode(cwd))
    if key is None or not os.path.isdir(directory):
        return None
    return key, {
        "argv": argv[1:], "env": environ, "cwd": directory, "preexec": preexec,
        "fork_children": None,
    }  # fmt: skip


class Popen(_RealPopen[Any]):
    """``subprocess.Popen`` whose Python children are forked by a fork server when they can.

    ``fork_children=True``: the child's own Python children are forked the same way (its
    ``subprocess.Popen`` is this class), for programs such as the examples that start them
    with ``subprocess`` themselves.
    """

    _server: socket.socket | None = None
    _replies = b""

    def __init__(self, *args: Any, fork_children: bool = False, **kwargs: Any) -> None:
        self._fork_children = fork_children
        super().__init__(*args, **kwargs)

    def _execute_child(
        self, args: Any, executable: Any, preexec_fn: Any, close_fds: bool,
        pass_fds: Sequence[int], cwd: Any, env: Any, startupinfo: Any, creationflags: int,
        shell: bool, p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int, errread: int,
        errwrite: int, restore_signals: bool, gid: Any, gids: Any, uid: Any, umask: int,
        start_new_session: bool, process_group: int,
    ) -> None:  # fmt: skip
        asked = _request(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, shell,
                         gid, gids, uid, umask, start_new_session, process_group)  # fmt: skip
        if asked is not None:
            key, request = asked
            if self._fork_children:
                request["fork_children"] = [__file__, str(_session_dir()), _owner()]
            std = [p2cread, c2pwrite, errwrite]
            pid = self._fork(key, request, [fd if fd != -1 else i for i, fd in enumerate(std)])
            if pid is not None:
                self.pid = pid
                self._child_created = True
                # (typing) Popen's internals: a forked child is waited for as Popen's own
                self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]
                return
        super()._execute_child(
            args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
            creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
            restore_signals, gid, gids, uid, umask, start_new_session, process_group,
        )  # fmt: skip

    def _fork(self, key: str, request: dict[str, Any], fds: list[int]) -> int | None:
        path = _socket(key)
        if path is None:
            fallbacks.append(f"no fork server for PYTHONHASHSEED={key}")
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(120)
            conn.connect(str(path))
            payload = json.dumps(request).encode()
            message = struct.pack(">I", len(payload)) + payload
            sent = socket.send_fds(conn, [message], fds)
            if sent < len(message):
                conn.sendall(message[sent:])
            reply = self._reply(conn, time.monotonic() + 120)
        except OSError as exc:
            conn.close()
            warnings.warn(f"the fork server for PYTHONHASHSEED={key}: {exc}", stacklevel=4)
            fallbacks.append(f"{key}: {exc}")
            return None
        if reply is not None and "pid" in reply:
            self._server = conn
            return int(reply["pid"])
        conn.close()
        reason = "no answer" if reply is None else reply.get("fallback") or reply.get("error")
        if reply is None or "error" in reply:
            warnings.warn(f"the fork server for PYTHONHASHSEED={key}: {reason}", stacklevel=4)
        fallbacks.append(f"{request['argv'][:2]}: {reason}")
        return None

    def _reply(self, conn: socket.socket, deadline: float) -> dict[str, Any] | None:
        """The server's next line (None once ``deadline`` passes)."""
        while b"\n" not in self._replies:
            left = None if deadline == float("inf") else max(deadline - time.monotonic(), 0)
            ready, _, _ = select.select([conn], [], [], left)
            if not ready:
                return None
            data = conn.recv(4096)
            if not data:
                raise ConnectionError("the fork server closed the connection")
            self._replies += data
        line, _, self._replies = self._replies.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _status(self, deadline: float) -> bool:
        """Take the child's exit status if it comes before ``deadline``; whether it did."""
        assert self._server is not None
        reply = self._reply(self._server, deadline)
        if reply is None:
            return False
        self._server.close()
        self._server = None
        # (typing) Popen's internals: a forked child is waited for as Popen's own
        self._handle_exitstatus(int(reply["status"]))  # type: ignore[attr-defined]
        return True

    def _internal_poll(self, _deadstate: Any = None, **_: Any) -> int | None:
        if self._server is None:
            return super()._internal_poll(_deadstate=_deadstate)
        # (typing) Popen's internals: a forked child is waited for as Popen's own
        if self._waitpid_lock.acquire(False):  # type: ignore[attr-defined]
            try:
                if self._server is not None:
                    self._status(time.monotonic())
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                # (typing) Popen's internals: a forked child is waited for as Popen's own
                self._waitpid_lock.release()  # type: ignore[attr-defined]
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        if self._server is None:
            return super()._wait(timeout)
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        # (typing) Popen's internals: a forked child is waited for as Popen's own
        with self._waitpid_lock:  # type: ignore[attr-defined]
            if self._server is not None and not self._status(deadline):
                raise _subprocess.TimeoutExpired(self.args, timeout)
        assert self.returncode is not None
        return self.returncode


def run(
    *popenargs: Any, input: Any = None, capture_output: bool = False,
    timeout: float | None = None, check: bool = False, **kwargs: Any,
) -> _subprocess.CompletedProcess[Any]:  # fmt: skip
    """``subprocess.run`` with :class:`Popen`."""
    if input is not None:
        kwargs["stdin"] = _subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = _subprocess.PIPE
    with Popen(*popenargs, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except _subprocess.TimeoutExpired as exc:
            process.kill()
            exc.stdout, exc.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
        code = process.poll()
        assert code is not None
        if check and code:
            raise _subprocess.CalledProcessError(code, process.args, stdout, stderr)
    return _subprocess.CompletedProcess(process.args, code, stdout, stderr)


class _SubprocessModule(types.ModuleType):
    """The ``subprocess`` module, with this module's ``Popen`` and ``run``."""

    Popen = Popen
    run = staticmethod(run)

    def __getattr__(self, name: str) -> Any:
        return getattr(_subprocess, name)


subprocess = _SubprocessModule("subprocess")
