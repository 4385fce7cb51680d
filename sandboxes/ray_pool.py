"""Sandbox pools as Ray actors, one per node, with an exec-by-lease API (architecture.md §5 `ray`).

    pools = start_node_pools(cfg.sandbox, run_id=run_id)        # {node_id: actor}, one per alive node
    sb = await acquire(pools[node_id], timeout=30)              # a RaySandbox: the Sandbox protocol
    await sb.exec("python3 -c 'print(1)'")
    await sb.close()                                            # releases the lease

The actor owns a `SandboxPool`; callers hold only a lease id, so a trajectory placed on a node
runs its tools in that node's sandboxes and nothing but small messages crosses the network.
`upload`/`download` move host files as tar bytes, so they work from any node.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any

from agentrl.config import SandboxConfig

from . import make_pool
from .base import ExecResult
from .common import SandboxError

ACTOR_PREFIX = "agentrl-sandbox-pool"


def _pack(path: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(path, arcname="payload")
    return buf.getvalue()


def _unpack(blob: bytes, dst: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dst, filter="data")


class SandboxPoolActor:
    """The body of the `RaySandboxPool` actor (kept plain so it reads and tests without Ray)."""

    def __init__(self, cfg: Any, run_id: str | None = None, name: str = "ray", size: int | None = None) -> None:
        cfg = cfg if isinstance(cfg, SandboxConfig) else SandboxConfig(**cfg)
        self.backend = cfg.backend
        self.pool = make_pool(cfg, run_id=run_id, name=name, size=size)
        self.leases: dict[str, Any] = {}

    async def start(self) -> str:
        await self.pool.start()
        return os.uname().nodename

    def _lease(self, lease_id: str) -> Any:
        try:
            return self.leases[lease_id]
        except KeyError:
            raise SandboxError(f"unknown or released sandbox lease {lease_id!r}") from None

    async def acquire(self, timeout: float | None = None) -> str:
        lease = await self.pool.get(timeout=timeout)
        lease_id = uuid.uuid4().hex
        self.leases[lease_id] = lease
        return lease_id

    async def release(self, lease_id: str) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            await lease.close()

    async def exec(self, lease_id: str, cmd: str | list[str], timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> ExecResult:
        return await self._lease(lease_id).exec(cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin)

    async def write_file(self, lease_id: str, path: str, content: str | bytes) -> None:
        await self._lease(lease_id).write_file(path, content)

    async def read_file(self, lease_id: str, path: str) -> bytes:
        return await self._lease(lease_id).read_file(path)

    async def reset(self, lease_id: str) -> None:
        await self._lease(lease_id).reset()

    async def upload_tar(self, lease_id: str, blob: bytes, remote_path: str) -> None:
        with tempfile.TemporaryDirectory(prefix="agentrl-ray-up-") as tmp:
            _unpack(blob, Path(tmp))
            await self._lease(lease_id).upload(os.path.join(tmp, "payload"), remote_path)

    async def download_tar(self, lease_id: str, remote_path: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="agentrl-ray-down-") as tmp:
            await self._lease(lease_id).download(remote_path, os.path.join(tmp, "payload"))
            return _pack(Path(tmp) / "payload")

    def metrics(self) -> dict[str, Any]:
        return {**self.pool.metrics(), "backend": self.backend, "leases": len(self.leases)}

    async def close(self) -> None:
        self.leases.clear()
        await self.pool.close()


class RaySandbox:
    """The Sandbox protocol over a lease held by a `RaySandboxPool` actor; `close()` releases it."""

    def __init__(self, actor: Any, lease_id: str) -> None:
        self.actor = actor
        self.lease_id = lease_id
        self._released = False

    async def exec(self, cmd: str | list[str], timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> ExecResult:
        return await self.actor.exec.remote(self.lease_id, cmd, timeout, cwd, env, stdin)

    async def write_file(self, path: str, content: str | bytes) -> None:
        await self.actor.write_file.remote(self.lease_id, path, content)

    async def read_file(self, path: str) -> bytes:
        return await self.actor.read_file.remote(self.lease_id, path)

    async def upload(self, local_path: str, remote_path: str) -> None:
        src = Path(local_path)
        if not src.exists():
            raise FileNotFoundError(f"upload source does not exist: {local_path}")
        await self.actor.upload_tar.remote(self.lease_id, _pack(src), remote_path)

    async def download(self, remote_path: str, local_path: str) -> None:
        blob = await self.actor.download_tar.remote(self.lease_id, remote_path)
        with tempfile.TemporaryDirectory(prefix="agentrl-ray-dl-") as tmp:
            _unpack(blob, Path(tmp))
            payload, dst = Path(tmp) / "payload", Path(local_path)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.is_dir() and payload.is_dir():
                shutil.copytree(payload, dst, dirs_exist_ok=True)
            else:
                payload.replace(dst)

    async def reset(self) -> None:
        await self.actor.reset.remote(self.lease_id)

    async def close(self) -> None:
        if not self._released:
            self._released = True
            await self.actor.release.remote(self.lease_id)


class NodePoolClient:
    """The pool interface an env uses (`get` / `put`) over a node's `RaySandboxPool` actor."""

    def __init__(self, actor: Any, node: str = "") -> None:
        self.actor = actor
        self.node = node
        self.leases = 0  # sandboxes this process borrowed from the node's pool

    async def get(self, timeout: float | None = None) -> RaySandbox:
        sandbox = await acquire(self.actor, timeout)
        self.leases += 1
        return sandbox

    async def put(self, sandbox: RaySandbox) -> None:
        await sandbox.close()

    def metrics(self) -> dict[str, Any]:
        return {"node": self.node, "leases": self.leases}


def ray_pool_class(num_cpus: float = 0, pool_cls: type = SandboxPoolActor) -> Any:
    """The `RaySandboxPool` actor class (async actor: many leases served concurrently)."""
    import ray  # optional: the ray extra

    return ray.remote(num_cpus=num_cpus)(pool_cls)


def start_node_pools(cfg: Any, run_id: str | None = None, size: int | None = None,
                     nodes: list[str] | None = None, num_cpus: float = 0,
                     pool_cls: type = SandboxPoolActor) -> dict[str, Any]:
    """One started `RaySandboxPool` actor per alive node (or per node id in `nodes`), pinned there
    and named `agentrl-sandbox-pool-<node id>` so any process can find it with `ray.get_actor`;
    `pool_cls` is `SandboxPoolActor` or a subclass (the training loop's `OwnedSandboxPool`)."""
    import ray  # optional: the ray extra
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # optional: the ray extra

    cfg_dict = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    node_ids = nodes or [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    if not node_ids:
        raise SandboxError("no alive Ray nodes to place sandbox pools on")
    actor_cls = ray_pool_class(num_cpus, pool_cls)
    actors = {
        node: actor_cls.options(name=f"{ACTOR_PREFIX}-{node}", get_if_exists=True,
                                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
        .remote(cfg_dict, run_id=run_id, name=f"ray-{node[:8]}", size=size)
        for node in node_ids
    }
    ray.get([a.start.remote() for a in actors.values()])
    return actors


async def acquire(actor: Any, timeout: float | None = None) -> RaySandbox:
    """Borrow a sandbox from a pool actor; raises the pool's SandboxTimeout when none frees up."""
    lease_id = await actor.acquire.remote(timeout)
    return RaySandbox(actor, lease_id)
