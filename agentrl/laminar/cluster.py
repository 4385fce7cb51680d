"""What a rollout worker actor builds for itself on Ray (design §9): nothing driver-local crosses.

    engines = [EngineFactory(cfg)] * cfg.laminar.num_workers    # each actor calls make_engine(cfg)
    env_factory = NodeEnvFactory(cfg, env_builder, run_id)       # envs on the node's sandbox pool

Both are plain picklable objects holding the config. `NodeEnvFactory` hands each env the sandbox
pool actor of the node its worker runs on (`agentrl-sandbox-pool-<node id>`, started by
`start_pools`), so tool calls never cross nodes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from agentrl.config import Config


def current_node() -> str:
    """This process's Ray node id, or "local" outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except ImportError:
        pass
    return "local"


@dataclass
class EngineFactory:
    """Builds the configured engine where it is called (`make_engine`, the one factory)."""

    cfg: Config

    def __call__(self) -> Any:
        from agentrl.inference import make_engine

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


def node_pool() -> Any:
    """The pool client of the sandbox pool actor on this process's node."""
    from agentrl.sandboxes.ray_pool import ACTOR_PREFIX, NodePoolClient

    node = current_node()
    if node not in _NODE_POOLS:
        import ray

        try:
            actor = ray.get_actor(f"{ACTOR_PREFIX}-{node}")
        except ValueError as e:
            raise RuntimeError(f"no sandbox pool actor on node {node}; start_pools() starts one per node") from e
        _NODE_POOLS[node] = NodePoolClient(actor, node)
    return _NODE_POOLS[node]


async def start_pools(cfg: Config, run_id: str) -> dict[str, Any]:
    """One sandbox pool actor per alive node (CPUs from `laminar.pool_num_cpus`)."""
    import asyncio

    from agentrl.sandboxes.ray_pool import start_node_pools

    return await asyncio.to_thread(start_node_pools, cfg.sandbox, run_id=run_id,
                                   num_cpus=cfg.laminar.pool_num_cpus)


async def stop_pools(pools: dict[str, Any]) -> None:
    """Close every pool (its sandboxes go) and end the actors."""
    import asyncio

    import ray

    for actor in pools.values():
        with contextlib.suppress(Exception):
            await asyncio.wait_for(actor.close.remote(), 60)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


def local_cluster_cpus(cfg: Config) -> int:
    """Logical CPUs of a `--ray local` cluster: enough for every actor this run reserves
    (Ray would otherwise leave an actor pending forever on a small machine)."""
    lam = cfg.laminar
    needed = lam.num_workers * lam.worker_num_cpus + lam.pool_num_cpus + 1
    return max(os.cpu_count() or 1, int(needed + 0.999))


@dataclass
class RemoteEngine(EngineFactory):
    """The driver's placeholder for an engine a Ray actor builds: callable there, closable here."""

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def loop_runtime(cfg: Config, run_id: str, env_factory: Callable[[], Any],
                       env_builder: Callable[[Config, Any], Any]) -> AsyncIterator[tuple[Any, Callable[[], Any]]]:
    """The runtime and env factory the training loop runs with: locally (None, `env_factory`);
    with `laminar.ray_address`, a Ray runtime, one sandbox pool actor per node and a
    `NodeEnvFactory` (the pools and a cluster this call started end with the block)."""
    if cfg.laminar.ray_address is None:
        yield None, env_factory
        return
    from agentrl.laminar.loop import ray_runtime

    runtime = ray_runtime(cfg)
    pools: dict[str, Any] = {}
    try:
        pools = await start_pools(cfg, run_id)
        yield runtime, NodeEnvFactory(cfg, env_builder)
    finally:
        await stop_pools(pools)
        runtime.close()
