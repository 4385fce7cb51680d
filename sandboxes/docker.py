"""Docker sandboxes through the Docker SDK (any engine the `docker` package can reach).

One long-lived container per sandbox: `--network none`, memory/CPU/pids limits, a read-only root
filesystem (by default) with size-capped tmpfs mounts at /work (`disk_mb`) and /tmp (half of
`memory_mb`), logging off (the engine
keeps no copy of any output), no new privileges,
and labels (`agentrl.run_id`, `agentrl.pool`, `agentrl.created`) so `admin.prune` can find leaked
containers, also those of crashed runs.

PID 1 is the agent (`agent.py`) on the container's attached stdin/stdout, so an exec is one JSON
line each way and a fork inside, not a `docker exec` (a runc start per call). As PID 1 it also
reaps orphans, and its `reset` kills every other process and empties /work and /tmp. SDK calls are
blocking: they run on worker threads, never on the event loop. The image needs `python3` (any
Debian/Ubuntu image with it).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import socket
import time
from typing import Any

from .agent_sandbox import AGENT_ARGS, AgentChannel, AgentSandbox, in_thread
from .common import WORKDIR, Limits, SandboxError

LABEL_RUN = "agentrl.run_id"
LABEL_POOL = "agentrl.pool"
LABEL_CREATED = "agentrl.created"
LABEL_SANDBOX = "agentrl.sandbox"  # marks every container we start, whatever its run
DEFAULT_IMAGE = "agentrl-base:bookworm"
START_TIMEOUT_S = 60.0
# The longest one Docker SDK call may wait for the engine's answer: a wedged engine must not hang a
# run (its starts, removals, the exit hook) for minutes; a loaded engine starts a container well within it.
ENGINE_TIMEOUT_S = 30
PING_TIMEOUT_S = 10  # the pools' liveness probe (engine_ping), and the exit hook's check that anyone answers
REMOVE_RETRY_S = (0.5, 2.0, 5.0, None)  # waits between attempts to remove a container (None: the last)

_LIVE: dict[str, Any] = {}  # containers started by this process and not yet removed


@atexit.register
def _remove_leftovers() -> None:
    """Last line of defence at interpreter exit (a crash that skips even this is what prune is for)."""
    if not _LIVE:
        return
    try:
        engine_ping()
    except Exception:  # nobody to ask (a wedged engine): `agentrl sandbox prune` removes them later
        return
    for container in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
    _LIVE.clear()


@functools.cache
def docker_client() -> Any:
    """The shared SDK client (one connection pool for every sandbox in this process)."""
    try:
        import docker  # optional: the Docker SDK
    except ImportError:
        raise SandboxError("the docker backend needs the Docker SDK: pip install 'agentrl[docker]'") from None
    try:
        client = docker.from_env(max_pool_size=64, timeout=ENGINE_TIMEOUT_S)
        client.ping()
    except Exception as e:
        raise SandboxError(f"no Docker engine answers ({e}); start one, e.g. sudo scripts/docker_up.sh") from e
    return client


@functools.cache
def _ping_client() -> Any:
    import docker  # the docker extra; docker_client() said what to install if it is missing

    return docker.from_env(timeout=PING_TIMEOUT_S)


def engine_ping() -> None:
    """Raises unless the Docker engine answers a ping within PING_TIMEOUT_S (a client of its own, so
    the shared client's busy connections cannot delay it)."""
    _ping_client().ping()


def _reload(container: Any) -> bool:
    try:
        container.reload()
    except Exception:
        return False
    return True


class DockerSandbox(AgentSandbox):
    """A container on a Docker engine. Nothing starts until `start()` or the first call."""

    command_nice = 10  # the container is its own CPU cgroup: niceness ranks only its own processes

    def __init__(self, image: str = DEFAULT_IMAGE, limits: Limits | None = None, *, run_id: str | None = None,
                 pool: str = "default", read_only: bool = True, labels: dict[str, str] | None = None,
                 client: Any = None) -> None:
        super().__init__(limits, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        self.image = image
        self.run_id = run_id or "none"
        self.pool = pool
        # A writable rootfs (e.g. a SWE image whose repo lives outside /work) cannot be wiped in place,
        # so reset() recreates the container instead.
        self.read_only = read_only
        self.labels = {LABEL_SANDBOX: "1", LABEL_RUN: self.run_id, LABEL_POOL: pool, **(labels or {})}
        self._client = client
        self._container: Any = None

    @property
    def id(self) -> str | None:
        return None if self._container is None else self._container.id

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = docker_client()
        return self._client

    def _launch(self) -> AgentChannel:
        container = self._run_container()
        _LIVE[container.id] = container
        self._container = container
        try:
            return self._attach(container)
        except BaseException:
            self._teardown()
            raise

    def _kill(self) -> None:
        import docker  # optional: the Docker SDK

        if self._container is not None:
            with contextlib.suppress(docker.errors.APIError):  # already dead: the same outcome
                self._container.kill()

    def _teardown(self) -> None:
        import docker  # optional: the Docker SDK

        container, self._container = self._container, None
        if container is None:
            return
        for delay in REMOVE_RETRY_S:  # a loaded engine may refuse at first (e.g. removal already in progress)
            try:
                container.remove(force=True, v=True)
            except docker.errors.NotFound:
                break
            except docker.errors.APIError:
                if delay is None:  # still there: the exit hook and `agentrl sandbox prune` will try again
                    raise
                time.sleep(delay)
                continue
            break
        _LIVE.pop(container.id, None)

    def _run_container(self) -> Any:
        import docker  # optional: the Docker SDK

        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"docker image {self.image!r} not found; build the base image with "
                               f"`sudo scripts/docker_up.sh` or a task image with `agentrl sandbox build`") from None
        lim = self.limits
        # tmpfs pages are charged to the container's memory cgroup: the cgroup holds memory_mb for the
        # processes and /tmp, plus disk_mb for /work, so a full /work is ENOSPC, never an OOM kill
        cgroup_mb = lim.memory_mb + lim.disk_mb
        return self.client.containers.run(
            self.image, ["python3", *AGENT_ARGS], detach=True, stdin_open=True,
            labels={**self.labels, LABEL_CREATED: str(int(time.time()))},
            network_mode="none", mem_limit=f"{cgroup_mb}m", memswap_limit=f"{cgroup_mb}m",
            nano_cpus=int(lim.cpus * 1e9), pids_limit=lim.pids, read_only=self.read_only,
            # /work and /tmp are size-capped tmpfs (the engine's --storage-opt size needs overlay2
            # on XFS with project quotas, which a default install does not have)
            tmpfs={"/tmp": f"rw,exec,nosuid,size={max(lim.memory_mb // 2, 1)}m",
                   WORKDIR: f"rw,exec,nosuid,size={lim.disk_mb}m,mode=755"},
            working_dir=WORKDIR, hostname="sandbox",
            log_config=docker.types.LogConfig(type="none"),  # the engine keeps no copy of any output
            environment=self.base_env, security_opt=["no-new-privileges"],
            cap_drop=["NET_RAW", "NET_ADMIN", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP"],
            ulimits=[docker.types.Ulimit(name="fsize", soft=lim.file_size_mb * 2**20, hard=lim.file_size_mb * 2**20),
                     docker.types.Ulimit(name="core", soft=0, hard=0)])

    def _attach(self, container: Any) -> AgentChannel:
        from docker.utils.socket import STDOUT, frames_iter  # optional: the Docker SDK

        sock = self.client.api.attach_socket(container.id, params={"stdin": 1, "stdout": 1, "stream": 1})
        raw = getattr(sock, "_sock", sock)

        def close() -> None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

        chunks = (data for stream, data in frames_iter(sock, tty=False) if stream == STDOUT)
        channel = AgentChannel(raw.sendall, chunks, close)
        try:  # the agent may not be listening yet: its answer to this ping says it is
            channel.request("ping").result(timeout=START_TIMEOUT_S)
        except Exception as e:
            channel.close()
            state = container.attrs.get("State", {}) if _reload(container) else {}
            raise SandboxError(f"the sandbox agent in {self.image} did not start ({e}); does the image have "
                               f"python3? container state: {state.get('Status')}, exit code "
                               f"{state.get('ExitCode')}, error {state.get('Error')!r}") from e
        return channel

    async def reset(self) -> None:
        """Back to the image's clean state: kill every process and empty /work and /tmp (read-only
        rootfs), or recreate the container (writable rootfs)."""
        if self.read_only or self._closed:
            await super().reset()
            return
        await in_thread(self._close_sync)
        await self.start()

    def __repr__(self) -> str:
        short = self.id[:12] if self.id else "not started"
        return f"DockerSandbox({self.image}, {short})"
