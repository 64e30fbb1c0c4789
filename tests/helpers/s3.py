"""An S3-compatible server on localhost for the tests: moto's server, spoken to through s3fs.

The server runs in a thread of the test process (``moto.server.ThreadedMotoServer``) on a
free port of 127.0.0.1. Its buckets live in this process, so :meth:`S3Server.restart` drops
every connection and refuses new ones until it is back (as a restarting server does) while
the stored objects stay. Nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

__all__ = ["FaultyProxy", "Hold", "S3Server", "options_for", "pause_after_first_upload"]

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def options_for(endpoint: str) -> dict[str, Any]:
    """s3fs storage options that reach the server at ``endpoint`` with the test credentials."""
    return {
        "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,  # a fresh client per storage: no stale connections
    }


def pause_after_first_upload() -> None:
    """From now on, the first file this process uploads to a fsspec store is followed by
    ``mid-upload`` on stdout and a wait for the SIGKILL the test sends (kill helpers)."""
    from statekeeper.storage import fsspec as fsspec_storage

    real = fsspec_storage._FsspecFiles.write_chunks

    def then_wait(self: Any, name: str, chunks: Any) -> None:
        real(self, name, chunks)
        print("mid-upload", flush=True)
        while True:
            time.sleep(60)  # killed here, with the step half uploaded

    # (typing) a test double stands in for the method in this test, put back after
    fsspec_storage._FsspecFiles.write_chunks = then_wait  # type: ignore[method-assign]


class S3Server:
    """One moto S3 server; ``options`` are the s3fs storage options that reach it."""

    def __init__(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        for key, value in CREDENTIALS.items():  # set when absent; requests go to localhost
            os.environ.setdefault(key, value)
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        self.port = 0
        self._server: Any = None  # a moto.server.ThreadedMotoServer
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> dict[str, Any]:
        fail_fast = {"retries": {"max_attempts": 1, "mode": "standard"}}
        return options_for(self.endpoint) | {"config_kwargs": fail_fast}

    def start(self) -> None:
        from moto.server import ThreadedMotoServer  # here: the kill helpers never need it

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        server.start()
        self.port = server.get_host_and_port()[1]
        self._server = server

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            inner = server._server
            if inner is not None:
                inner.server_close()  # the port is free for the restart

    def restart(self) -> None:
        self.stop()
        self.start()

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(**self.options)

    def new_bucket(self) -> str:
        """A new empty bucket's name."""
        import boto3

        name = f"sk-{uuid.uuid4().hex[:12]}"
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        client.create_bucket(Bucket=name)  # us-east-1: no location constraint
        return name


class Hold:
    """A request :meth:`FaultyProxy.hold_next` keeps: ``reached`` once it arrived, sent on
    to the server once ``release()`` is called."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()


class FaultyProxy:
    """A TCP proxy on 127.0.0.1 in front of the S3 server, that can fail requests as a
    network does: ``cut_next(match)`` closes the connection of the next request whose
    request line contains ``match`` (before it reaches the server), ``corrupt_next(match)``
    flips the last byte of the body of the answer to the next such request, ``down()``
    cuts every request until ``up()``, and ``hang()`` makes it a peer that accepts
    connections and never answers (what it is sent is swallowed), ``hold_next(match)``
    keeps the next such request from the server until its :class:`Hold` is released (a
    request in flight for as long as a test wants; ``reached`` is set once it arrived).
    ``requests`` lists the request lines that went through."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self._lock = threading.Lock()
        self._faults: list[tuple[str, str]] = []
        self._holds: list[tuple[str, Hold]] = []
        self._down = False
        self._hung = False
        self.requests: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> dict[str, Any]:
        fail_fast = {"retries": {"max_attempts": 1, "mode": "standard"}}
        return options_for(self.endpoint) | {"config_kwargs": fail_fast}

    def cut_next(self, match: str) -> None:
        with self._lock:
            self._faults.append(("cut", match))

    def corrupt_next(self, match: str) -> None:
        with self._lock:
            self._faults.append(("corrupt", match))

    def hold_next(self, match: str) -> Hold:
        hold = Hold()
        with self._lock:
            self._holds.append((match, hold))
        return hold

    def _held(self, line: str) -> Hold | None:
        with self._lock:
            for i, (match, hold) in enumerate(self._holds):
                if match in line:
                    del self._holds[i]
                    return hold
        return None

    def down(self) -> None:
        self._down = True

    def up(self) -> None:
        self._down = False

    def hang(self) -> None:
        self._hung = True

    def _fault(self, line: str) -> str | None:
        with self._lock:
            self.requests.append(line)
            if self._down:
                return "cut"
            for i, (kind, match) in enumerate(self._faults):
                if match in line:
                    del self._faults[i]
                    return kind
        return None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: Any) -> None:
        if self._hung:
            while client.recv(1 << 16):
                pass  # swallowed: never answered
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self._upstream))
        except OSError:
            client.close()
            return
        corrupt = threading.Event()

        def close() -> None:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

        def to_server() -> None:
            try:
                while data := client.recv(1 << 16):
                    if self._hung:
                        continue  # swallowed from now on
                    if data[:8].split(b" ")[0] in (b"GET", b"PUT", b"HEAD", b"POST", b"DELETE"):
                        line = data.split(b"\r\n", 1)[0].decode("latin-1")
                        kind = self._fault(line)
                        hold = self._held(line)
                        if hold is not None:
                            hold.reached.set()
                            hold.released.wait()  # until the test lets it through
                        if kind == "cut":
                            close()
                            return
                        if kind == "corrupt":
                            corrupt.set()
                    upstream.sendall(data)
            except OSError:
                pass

        def to_client() -> None:
            pending = b""
            try:
                while data := upstream.recv(1 << 16):
                    if self._hung:
                        continue
                    if corrupt.is_set():
                        pending += data
                        head, sep, body = pending.partition(b"\r\n\r\n")
                        if not sep:
                            continue
                        length = 0
                        for line in head.split(b"\r\n")[1:]:
                            name, _, value = line.partition(b":")
                            if name.strip().lower() == b"content-length":
                                length = int(value)
                        if len(body) < length:
                            continue
                        flipped = bytearray(body)
                        flipped[length - 1] ^= 0x01
                        data, pending = head + sep + bytes(flipped), b""
                        corrupt.clear()
                    client.sendall(data)
            except OSError:
                pass

        threading.Thread(target=to_server, daemon=True).start()
        to_client()
        close()
