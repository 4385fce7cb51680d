"""`LocalRuntime(serialize=True)`: every actor argument and answer crosses a cloudpickle round
trip, as on Ray, so a local test cannot hide a driver-local object that Ray would refuse."""

import asyncio
import functools
import threading

import pytest

from agentrl.laminar.loop import build_system, shutdown, train
from agentrl.laminar.runtime import LocalRuntime

from .helpers import FakeLearner, check_single_version, fake_engine, make_env, small_config, tail_tasks


async def test_the_pipeline_runs_with_ray_style_arguments():
    cfg = small_config("laminar")
    engines = [functools.partial(fake_engine, seed=i) for i in range(2)]  # factories, as on Ray
    system = await build_system(cfg, make_env, tail_tasks(2, long_turns=2), engines, LocalRuntime(serialize=True))
    learner = FakeLearner(train_s=0.01)
    try:
        summary = await asyncio.wait_for(train(system, learner, steps=2, batch_groups=2), 120)
    finally:
        await shutdown(system)
    assert summary["final_version"] == 2
    check_single_version([g for b in learner.seen for g in b])


async def test_a_driver_local_object_is_refused_like_on_ray():
    lock = threading.Lock()  # what a driver-side sandbox pool holds: Ray cannot pickle it

    def env_factory():
        with lock:
            return make_env()

    with pytest.raises(TypeError, match="lock"):
        await build_system(small_config("laminar"), env_factory, tail_tasks(1), [functools.partial(fake_engine)],
                           LocalRuntime(serialize=True))
