"""The same Laminar pipeline on a local Ray cluster: every component is an actor."""

import asyncio
import functools
import os
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from agentrl.inference.hf import HFEngine  # noqa: E402
from agentrl.laminar.loop import build_system, shutdown, train  # noqa: E402
from agentrl.laminar.runtime import RayRuntime  # noqa: E402
from agentrl.models import resolve_model  # noqa: E402
from agentrl.trainer.learner import Learner  # noqa: E402

from .helpers import (  # noqa: E402
    FakeLearner,
    check_single_version,
    fake_engine,
    kill_first_busy_worker,
    make_env,
    make_spread_env,
    small_config,
    tail_tasks,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TESTS_DIR = str(Path(__file__).resolve().parent.parent)  # actors import laminar.helpers from here


@pytest.fixture(scope="module")
def runtime():
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])}}
    # logical CPUs: two 1-CPU worker actors (laminar.worker_num_cpus) plus the small ones
    rt = RayRuntime(num_cpus=4, runtime_env=env)
    yield rt
    ray.shutdown()


async def test_ray_pipeline_real_model(runtime):
    path = resolve_model("smollm2-135m")
    cfg = small_config("laminar", **{"sampling.max_tokens": 3, "laminar.chunk_bytes": 64 * 1024 * 1024,
                                     "trainer.lr": 1e-6})
    engines = [functools.partial(HFEngine, path, max_batch_size=4, seed=i, num_threads=1) for i in range(2)]
    learner = Learner(path, cfg.trainer, temperature=cfg.sampling.temperature, reward_cfg=cfg.reward)
    tasks = tail_tasks(2, long_turns=3, tool_s=0.3)
    system = await build_system(cfg, make_spread_env, tasks, engines, runtime, shuffle_prompts=False)
    seen = []
    orig_step = learner.step
    learner.step = lambda groups: (seen.append(groups), orig_step(groups))[1]
    versions: list[int] = []
    try:
        summary = await asyncio.wait_for(train(system, learner, steps=2, batch_groups=1), 400)
        # A worker pulls only when it runs empty, so the trainer may finish on groups generated
        # before any pull; the prompt pool stays open, so wait for the first worker to refresh.
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            versions = [(await w.load()).version for w in system.workers.values()]
            if max(versions) >= 1:
                break
            await asyncio.sleep(0.5)
    finally:
        await shutdown(system)
    assert summary["runtime"] == "ray" and summary["final_version"] == 2
    check_single_version([g for b in seen for g in b])
    assert max(versions) >= 1, versions  # weights travelled trainer → master relay → chain → worker actor


async def test_ray_fault_worker_actor_killed(runtime):
    cfg = small_config("laminar")
    engines = [functools.partial(fake_engine, seed=i) for i in range(2)]
    system = await build_system(cfg, make_env, tail_tasks(2, long_turns=12, tool_s=0.1), engines, runtime,
                                shuffle_prompts=False)
    learner = FakeLearner(train_s=0.3)
    killed: dict = {}
    kill_busy_worker = kill_first_busy_worker(system, runtime.kill, killed)  # ray.kill on Ray

    try:
        summary = await asyncio.wait_for(train(system, learner, steps=8, batch_groups=2,
                                               on_step=kill_busy_worker), 200)
    finally:
        await shutdown(system)
    assert killed and killed["lost"]
    assert summary["dead_workers"] == [killed["name"]]
    assert summary["final_version"] == 8
    groups = [g for b in learner.seen for g in b]
    check_single_version(groups)
    assert all(len(g.trajectories) == 2 for g in groups)
    ids = [t.id for g in groups for t in g.trajectories]
    assert len(ids) == len(set(ids))
    regenerated = {g.id.split("~r")[0] for g in groups if "~r" in g.id}
    for lost in killed["lost"]:
        assert lost in ids or lost.rsplit("/", 1)[0] in regenerated
    buf = summary["buffer"]
    assert buf["trajectories_written"] == (buf["trajectories_consumed"] + buf.get("trajectories_dropped", 0)
                                           + buf.get("trajectories_evicted", 0) + buf["ready_trajectories"]
                                           + buf["pending_trajectories"])
