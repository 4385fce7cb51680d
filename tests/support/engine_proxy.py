"""A unix-socket proxy to the Docker engine that can be made to stop answering, as a wedged daemon
does: point DOCKER_HOST at `unix://PATH` and set `frozen` (bench/soak.py's and `agentrl train`'s
tests of an engine that stops answering mid-run)."""

from __future__ import annotations

import select
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

DOCKER_SOCKET = "/var/run/docker.sock"


class FreezableProxy(socketserver.ThreadingUnixStreamServer):
    """Forwards every connection to the engine; once `frozen` is set it keeps every connection
    open and moves no byte."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        self.frozen = threading.Event()
        self.closing = threading.Event()
        super().__init__(path, _Pump)


class _Pump(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: FreezableProxy = self.server  # type: ignore[assignment]
        upstream = socket.socket(socket.AF_UNIX)
        upstream.connect(DOCKER_SOCKET)
        peers = {self.request: upstream, upstream: self.request}
        with upstream:
            while not server.closing.is_set():
                if server.frozen.is_set():
                    time.sleep(0.1)
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)


@contextmanager
def freezable_engine(path: str) -> Iterator[FreezableProxy]:
    """A FreezableProxy listening at `path` for the duration of the block."""
    proxy = FreezableProxy(path)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield proxy
    finally:
        proxy.closing.set()
        proxy.shutdown()
        proxy.server_close()
