"""A two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`): one relay per node, each
worker pulls from its own node's relay, and each env takes its sandboxes from the pool actor of
its worker's node (real bubblewrap sandboxes; the engines are fakes built inside the actors)."""

import asyncio
import functools
import os
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from agentrl.laminar.cluster import NodeEnvFactory, current_node, start_pools, stop_pools
from agentrl.laminar.loop import build_system, shutdown, train
from agentrl.laminar.runtime import RayRuntime, this_node_first
from agentrl.types import Message, StepResult

from .helpers import FakeLearner, fake_engine, small_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TESTS_DIR = str(Path(__file__).resolve().parent.parent)


class NodeCheckEnv:
    """One turn; the tool call runs `echo` in a sandbox of the pool it was given and reports
    the pool's node and the node the env itself runs on."""

    def __init__(self, pool):
        self.pool = pool

    async def areset(self, task):
        self.sandbox = await self.pool.get(timeout=60)
        return [Message(role="system", content="Be terse."), Message(role="user", content="Hi.")]

    async def astep(self, action):
        out = await self.sandbox.exec("echo ran")
        await self.pool.put(self.sandbox)
        ok = self.pool.node == current_node() and out.stdout.strip() == "ran"
        return StepResult(observation=[], terminated=True,
                          info={"outcome_reward": 1.0 if ok else 0.0, "reward_components": {"same_node": float(ok)}})

    async def aclose(self):
        return None


def node_check_env(cfg, pool):
    return NodeCheckEnv(pool)


@pytest.fixture(scope="module")
def cluster():
    cl = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head": 1}})
    cl.add_node(num_cpus=2, resources={"second": 1})
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])}}
    rt = RayRuntime(address=cl.address, runtime_env=env)
    yield rt
    ray.shutdown()
    cl.shutdown()


async def test_two_nodes_relay_and_sandbox_pool_per_node(cluster):
    # per node: 2 CPUs = a worker (1.5) + the sandbox pool (0.25) + the small actors
    cfg = small_config("sync", **{"laminar.worker_num_cpus": 1.5, "laminar.pool_num_cpus": 0.25,
                                  "laminar.num_workers": 2, "laminar.wait_timeout_s": 60,
                                  "sandbox.backend": "local", "sandbox.pool_size": 2})
    nodes = this_node_first(cluster.nodes())  # the order of the relays: the master beside the trainer
    assert len(nodes) == 2 and nodes[0] == current_node()
    pools = await start_pools(cfg, run_id="test-two-nodes")
    assert sorted(pools) == sorted(nodes)
    engines = [functools.partial(fake_engine, seed=i) for i in range(2)]
    system = await build_system(cfg, NodeEnvFactory(cfg, node_check_env), [{"id": f"t{i}"} for i in range(4)],
                                engines, cluster)  # fails after wait_timeout_s if the workers cannot be placed
    learner = FakeLearner(train_s=0.05)
    try:
        summary = await asyncio.wait_for(train(system, learner, steps=2, batch_groups=2, wait_timeout_s=120), 150)
    finally:
        await shutdown(system)
        await stop_pools(pools)
    assert [r.name for r in system.chain.relays] == ["relay0", "relay1"]  # one per node
    workers = summary["workers"]
    assert sorted(w["node"] for w in workers.values()) == sorted(nodes)  # 1.5 of 2 CPUs each: one per node
    for w in workers.values():
        assert w["relay"] == f"relay{nodes.index(w['node'])}", w  # its own node's relay
        assert w["versions"], "pulled weights from it"
    trajs = [t for b in learner.seen for g in b for t in g.trajectories]
    assert trajs and all(t.reward_components.get("same_node") == 1.0 for t in trajs), \
        [t.reward_components for t in trajs]
