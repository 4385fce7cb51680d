"""An HTTP server run from a Docker image, reachable from this host only (docs/interop.md).

    server = docker_server("my-openenv-env:latest", port=8000)   # started once per process
    server.url                                                  # http://172.x.y.z:8000

The container joins a private `--internal` bridge network of its own: the host reaches it on the
bridge address, and it reaches nothing (no route out, no other container). It runs with Docker's
limits and labels (`agentrl.sandbox`, so `agentrl sandbox prune` finds a leaked one) and is
removed, with its network, by `stop_servers()` or at interpreter exit. The image must already be
on the engine: nothing is pulled.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from agentrl.errors import UserError
from agentrl.sandboxes.docker import LABEL_CREATED, LABEL_POOL, LABEL_SANDBOX, docker_client

START_TIMEOUT_S = 120.0


@dataclass
class DockerServer:
    image: str
    url: str
    container: Any
    network: Any


_SERVERS: dict[tuple[str, int], DockerServer] = {}
_LOCK = threading.Lock()


def docker_server(image: str, *, port: int = 8000, health_path: str = "/health",
                  memory_mb: int = 2048, start_timeout_s: float = START_TIMEOUT_S) -> DockerServer:
    """The running server of `image` (started on first use in this process)."""
    with _LOCK:
        server = _SERVERS.get((image, port))
        if server is None:
            server = _start(image, port, health_path, memory_mb, start_timeout_s)
            _SERVERS[(image, port)] = server
        return server


def _start(image: str, port: int, health_path: str, memory_mb: int, start_timeout_s: float) -> DockerServer:
    import docker  # the Docker SDK is agentrl[docker]; docker_client() already said how to get it

    client = docker_client()
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise UserError(f"docker image {image!r} is not on this Docker engine (agentrl pulls nothing)",
                        fix=f"build or load it first, e.g. `docker build -t {image} .` in the env's directory "
                            "(OpenEnv envs ship a server/Dockerfile)") from None
    tag = uuid.uuid4().hex[:12]
    labels = {LABEL_SANDBOX: "1", LABEL_POOL: "openenv", LABEL_CREATED: str(int(time.time()))}
    network = client.networks.create(f"agentrl-openenv-{tag}", driver="bridge", internal=True, labels=labels)
    container = None
    try:
        container = client.containers.run(
            image, detach=True, name=f"agentrl-openenv-{tag}", network=network.name, labels=labels,
            mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m", security_opt=["no-new-privileges"],
            log_config=docker.types.LogConfig(type="json-file", config={"max-size": "1m"}))
        container.reload()
        address = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        url = f"http://{address}:{port}"
        _wait_healthy(container, url + health_path, start_timeout_s)
    except BaseException:
        _remove(container, network)
        raise
    return DockerServer(image, url, container, network)


def _wait_healthy(container: Any, health_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(health_url, timeout=2.0).status_code == 200:
                return
        container.reload()
        if container.status not in ("created", "running"):
            logs = container.logs(tail=20).decode(errors="replace").strip().replace("\n", " | ")
            raise UserError(f"the container of {container.image.tags or container.image.id} exited "
                            f"({container.status}) before its server answered: {logs[-800:]}",
                            fix="run the image by hand (`docker run IMAGE`) to see why it stops")
        if time.monotonic() > deadline:
            raise UserError(f"the server in {container.name} did not answer {health_url} within {timeout_s:g} s",
                            fix="check that the image serves OpenEnv's HTTP API on the port given "
                                "(env.kwargs.port, default 8000)")
        time.sleep(0.5)


def _remove(container: Any, network: Any) -> None:
    if container is not None:
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
    if network is not None:
        with contextlib.suppress(Exception):
            network.remove()


@atexit.register
def stop_servers() -> None:
    """Remove every container and network started here (also run at interpreter exit)."""
    with _LOCK:
        for server in _SERVERS.values():
            _remove(server.container, server.network)
        _SERVERS.clear()
