"""A fork server for the tests' child interpreters (the client is tests/helpers/launcher.py).

Run as ``python tests/helpers/zygote.py SOCKET OWNER_PID``, with the ``PYTHONHASHSEED`` its
children must have. It imports torch and the other heavy libraries once (it runs no tensor
operation, so torch starts no thread), listens on the unix socket SOCKET, and for each
request forks a child that becomes what ``python -m MODULE ARGS``, ``python -c CODE ARGS`` or
``python SCRIPT ARGS`` would have been: the request's stdin/stdout/stderr (passed as file
descriptors), argv, environment, working directory, ``sys.path``, a fresh ``__main__``, and
fresh random seeds for Python, numpy and torch (zygote_child.py). The child's exit is a
fresh interpreter's: ``SystemExit`` codes, a traceback and status 1 for an uncaught exception,
non-daemon threads joined, atexit handlers run, ``os._exit`` and signals as they are.

The server answers the pid of each child, then its raw wait status when it ends (it watches
children through pidfds, so the server stays single-threaded). A request it cannot honour
exactly (an environment variable read at start-up that differs from the server's, a module
already imported here) is answered "fallback": the client then starts a fresh interpreter.
The server exits when the process OWNER_PID (the pytest session) ends.

Besides the preload, only the standard library and zygote_child.py are imported: nothing from
statekeeper or the tests, so children import the current sources as a fresh process would.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import selectors
import socket
import struct
import sys
import threading
import traceback
from typing import Any

import zygote_child  # this file's folder is sys.path[0] while the server starts

PRELOAD = (
    "numpy", "torch", "torch.nn", "torch.optim", "torch.utils.data",
    "torch.distributed", "torch.distributed.fsdp", "torch.distributed.device_mesh",
    "torch.distributed.tensor", "torch.distributed.checkpoint",
    "torchdata.stateful_dataloader", "torchdata.stateful_dataloader.sampler",
    "safetensors.torch", "click", "click.testing", "rich.console", "pytest",
    "transformers", "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.bert.modeling_bert", "transformers.models.llama.modeling_llama",
    "transformers.models.t5.modeling_t5",
)  # fmt: skip
"""Imported once here: what the children would spend most of their start-up importing."""

STARTUP_ENV = (
    "PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOTO", "LD_", "MALLOC", "GLIBC_", "TORCH",
    "PYTORCH", "HF_", "TRANSFORMERS", "TOKENIZERS", "NUMPY", "CUDA", "LANG", "LC_", "HOME", "TZ",
)  # fmt: skip
"""Prefixes of environment variables read at interpreter or library start-up: a request whose
value of one differs from the server's gets a fresh interpreter instead."""
_NOT_AT_STARTUP = (
    "PYTHONHASHSEED",  # the server's own (the client picks the server by it)
    "PYTHONPATH",  # sys.path is rebuilt for each child
    "PYTORCH_NVML_BASED_CUDA_CHECK",  # read by torch.cuda at each call; lightning sets it
)


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_ENV) and k not in _NOT_AT_STARTUP}


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request: a 4-byte length, a JSON object, and three descriptors (0, 1, 2)."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("request cut short")
        data += more
    return json.loads(data[4:]), list(fds)


def _answer(conn: socket.socket, **fields: Any) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(fields).encode() + b"\n")


class Server:
    def __init__(self, path: str, owner: int, base_path: list[str], env: dict[str, str]) -> None:
        self.base_path = base_path
        self.env = _startup_env(env)
        self.set_by_imports = {k: v for k, v in os.environ.items() if env.get(k) != v}
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.owner = os.pidfd_open(owner)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.owner, selectors.EVENT_READ, "owner")
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, conn)

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.data == "owner":
                    return
                if key.data == "accept":
                    conn, _ = self.listener.accept()
                    self._request(conn)
                else:
                    self._reap(key.fd)

    def _reap(self, pidfd: int) -> None:
        pid, conn = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        _answer(conn, status=status)
        conn.close()

    def _request(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            conn.settimeout(30)
            request, fds = _receive(conn)
            reason = self._unfit(request, len(fds))
            if reason:
                _answer(conn, fallback=reason)
                conn.close()
                return
            pid = os.fork()
            if pid == 0:
                try:
                    self._close_all(conn)
                    zygote_child.become(request, fds, self.base_path, self.set_by_imports)
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(70)  # not reached unless the set-up failed: _become ends it
            pidfd = os.pidfd_open(pid)
        except Exception as exc:
            _answer(conn, error=f"{type(exc).__name__}: {exc}")
            conn.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        self.children[pidfd] = (pid, conn)
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        _answer(conn, pid=pid)

    def _unfit(self, request: dict[str, Any], fds: int) -> str:
        if fds != 3:
            return f"expected 3 file descriptors, got {fds}"
        env = {
            k: v
            for k, v in _startup_env(request["env"]).items()
            if self.set_by_imports.get(k) != v  # set by the same import in the caller
        }
        if env != self.env:
            keys = env.keys() | self.env.keys()
            differ = sorted(k for k in keys if env.get(k) != self.env.get(k))
            return f"start-up environment differs: {', '.join(differ)}"
        argv = request["argv"]
        if argv[0] == "-m" and argv[1] in sys.modules:
            return f"{argv[1]} is imported in the server"
        return ""

    def _close_all(self, conn: socket.socket) -> None:
        """In a new child: drop every descriptor of the server."""
        self.selector.close()
        self.listener.close()
        os.close(self.owner)
        for pidfd, (_, other) in self.children.items():
            os.close(pidfd)
            other.close()
        conn.close()


def preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if threading.active_count() != 1:
        raise RuntimeError(f"a preloaded module started threads: {threading.enumerate()}")
    gc.collect()
    gc.freeze()  # the children do not copy the preloaded objects' pages when they collect


def main() -> None:
    path, owner = sys.argv[1], int(sys.argv[2])
    del sys.path[0]  # this file's folder: nothing here must shadow what the children import
    base_path, env = list(sys.path), dict(os.environ)
    preload()
    server = Server(path, owner, base_path, env)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the starter stops reading: nothing of ours may block on that pipe
    os.close(devnull)
    try:
        server.serve()
    finally:
        _clean_up(path)


def _clean_up(path: str) -> None:
    """Remove this server's files; the last server of the session removes the folder."""
    folder = os.path.dirname(path)
    stem = path.removesuffix(".sock")
    for leftover in (path, stem + ".log", stem + ".lock"):
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    with contextlib.suppress(OSError):
        if not any(name.endswith(".sock") for name in os.listdir(folder)):
            for name in os.listdir(folder):
                if name.endswith((".lock", ".log", ".failed")):
                    os.unlink(os.path.join(folder, name))
            os.rmdir(folder)


if __name__ == "__main__":
    main()
