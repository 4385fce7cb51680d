"""What a rollout worker actor builds for itself on Ray (architecture.md §9): nothing driver-local crosses.

    engines = [EngineFactory(cfg)] * cfg.laminar.num_workers    # each actor calls make_engine(cfg)
    env_factory = NodeEnvFactory(cfg, env_builder, run_id)       # envs on the node's sandbox pool

Both are plain picklable objects holding the config. `NodeEnvFactory` hands each env the sandbox
pool actor of the node its worker runs on (`agentrl-sandbox-pool-<node id>`, started by
`start_pools`), so tool calls never cross nodes. That actor (`OwnedSandboxPool`) records which OS
process holds each lease and takes back the sandboxes of a process that died holding them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from agentrl.config import Config
from agentrl.inference import make_engine
from agentrl.laminar.runtime import current_node, local_cluster_cpus, process_start_time, ray_runtime
from agentrl.sandboxes.ray_pool import (
    ACTOR_PREFIX,
    NodePoolClient,
    RaySandbox,
    SandboxPoolActor,
    start_node_pools,
)

__all__ = ["EngineFactory", "NodeEnvFactory", "OwnedPoolClient", "OwnedSandboxPool", "RemoteEngine", "current_node",
           "local_cluster_cpus", "loop_runtime", "node_pool", "pool_metrics", "ray_session", "start_pools",
           "stop_pools"]


@dataclass
class EngineFactory:
    """Builds the configured engine where it is called (`make_engine`, the one factory)."""

    cfg: Config

    def __call__(self) -> Any:
        return make_engine(self.cfg)


_NODE_POOLS: dict[str, Any] = {}  # per process: the client of this node's pool actor


@dataclass
class NodeEnvFactory:
    """Builds an env with `env_builder(cfg, pool)`, the pool being this node's sandbox pool actor
    (`pools=False`: no pool, for envs that need no sandbox). `env_builder` must be importable
    (a module-level function), which is what lets the factory cross to another process."""

    cfg: Config
    env_builder: Callable[[Config, Any], Any]
    pools: bool = True

    def __call__(self) -> Any:
        return self.env_builder(self.cfg, node_pool() if self.pools else None)


class OwnedSandboxPool(SandboxPoolActor):
    """A node's sandbox pool actor that also takes back the sandboxes of a process that died holding
    them: a SIGKILLed rollout worker never returns its leases, and a pool of `sandbox.pool_size`
    would shrink by as many for the rest of the run (the survivors' envs then wait forever in
    `pool.get()`). Each lease records the OS process that took it (its pid and start time: the
    pool and its clients share a node); every `reap_interval_s` the leases of processes that are
    gone go back to the pool, reset as on a normal return."""

    def __init__(self, cfg: Any, run_id: str | None = None, name: str = "ray", size: int | None = None,
                 reap_interval_s: float = 1.0) -> None:
        super().__init__(cfg, run_id=run_id, name=name, size=size)
        self.owners: dict[str, tuple[int, str]] = {}  # lease id -> (pid, start time) of its holder
        self.acquires_by_pid: dict[int, int] = {}  # which processes this node's sandboxes served
        self.reclaimed = 0
        self.reap_interval_s = reap_interval_s
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> str:
        host = await super().start()
        if os.path.isdir("/proc") and self._reaper is None:
            self._reaper = asyncio.ensure_future(self._reap_loop())
        return host

    async def acquire_for(self, pid: int, timeout: float | None = None) -> str:
        """`acquire` on behalf of process `pid` of this node: its leases come back if it dies."""
        born = process_start_time(pid)
        lease_id = await self.acquire(timeout)
        self.acquires_by_pid[pid] = self.acquires_by_pid.get(pid, 0) + 1
        if born is not None:
            self.owners[lease_id] = (pid, born)
        return lease_id

    async def release(self, lease_id: str) -> None:
        self.owners.pop(lease_id, None)
        await super().release(lease_id)

    async def reap(self) -> int:
        """Take back the leases of processes that are gone; how many."""
        dead = [lease for lease, (pid, born) in self.owners.items() if process_start_time(pid) != born]
        for lease in dead:
            with contextlib.suppress(Exception):  # a sandbox that fails its reset is replaced by the pool
                await self.release(lease)
        self.reclaimed += len(dead)
        return len(dead)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval_s)
            with contextlib.suppress(Exception):
                await self.reap()

    def metrics(self) -> dict[str, Any]:
        return {**super().metrics(), "reclaimed": self.reclaimed, "node": current_node(),
                "acquires_by_pid": {str(pid): n for pid, n in self.acquires_by_pid.items()}}

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        self.owners.clear()
        await super().close()


class OwnedPoolClient(NodePoolClient):
    """`NodePoolClient` whose leases are taken in this process's name (see `OwnedSandboxPool`)."""

    async def get(self, timeout: float | None = None) -> RaySandbox:
        lease_id = await self.actor.acquire_for.remote(os.getpid(), timeout)
        self.leases += 1
        return RaySandbox(self.actor, lease_id)


def node_pool() -> Any:
    """The pool client of the sandbox pool actor on this process's node."""
    node = current_node()
    if node not in _NODE_POOLS:
        import ray  # optional: the ray extra

        try:
            actor = ray.get_actor(f"{ACTOR_PREFIX}-{node}")
        except ValueError as e:
            raise RuntimeError(f"no sandbox pool actor on node {node}; start_pools() starts one per node") from e
        _NODE_POOLS[node] = OwnedPoolClient(actor, node)
    return _NODE_POOLS[node]


async def start_pools(cfg: Config, run_id: str) -> dict[str, Any]:
    """One sandbox pool actor per alive node (CPUs from `laminar.pool_num_cpus`)."""
    return await asyncio.to_thread(start_node_pools, cfg.sandbox, run_id=run_id, num_cpus=cfg.laminar.pool_num_cpus,
                                   pool_cls=OwnedSandboxPool)


async def pool_metrics(pools: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each node's pool metrics (node id -> metrics), for the run summary; a pool that does not
    answer within 30 s is left out."""
    out = {}
    for node, actor in pools.items():
        with contextlib.suppress(Exception):
            out[node] = await asyncio.wait_for(actor.metrics.remote(), 30)
    return out


async def stop_pools(pools: dict[str, Any]) -> None:
    """Close every pool (its sandboxes go) and end the actors."""
    import ray  # optional: the ray extra

    for actor in pools.values():
        with contextlib.suppress(Exception):
            await asyncio.wait_for(actor.close.remote(), 60)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


@dataclass
class RemoteEngine(EngineFactory):
    """The driver's placeholder for an engine a Ray actor builds: callable there, closable here."""

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def ray_session(cfg: Config) -> AsyncIterator[Any]:
    """The run's Ray runtime with `laminar.ray_address` (a `--ray local` cluster it starts ends
    with the block), else None. Up from the start of the run: sharded learner ranks are Ray
    actors too (`trainer.num_learners > 1`)."""
    if cfg.laminar.ray_address is None:
        yield None
        return
    runtime = await asyncio.to_thread(ray_runtime, cfg)
    try:
        yield runtime
    finally:
        runtime.close()


@contextlib.asynccontextmanager
async def loop_runtime(cfg: Config, run_id: str, env_factory: Callable[[], Any],
                       env_builder: Callable[[Config, Any], Any], runtime: Any = None,
                       ) -> AsyncIterator[tuple[Any, Callable[[], Any], dict[str, Any]]]:
    """The runtime, env factory and sandbox pool actors (node id -> actor) the training loop runs
    with: locally (None, `env_factory`, {}); on Ray (`runtime`, from `ray_session`), one sandbox
    pool actor per node and a `NodeEnvFactory` (the pools end with the block)."""
    if runtime is None:
        yield None, env_factory, {}
        return
    if runtime.reaper is not None:  # a driver crash also takes this run's sandboxes (Docker: by label)
        runtime.reaper.watch_run(run_id, docker=cfg.sandbox.backend == "docker")
    pools: dict[str, Any] = {}
    try:
        pools = await start_pools(cfg, run_id)
        yield runtime, NodeEnvFactory(cfg, env_builder), pools
    finally:
        await stop_pools(pools)
