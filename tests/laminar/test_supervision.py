"""Supervision of rollout workers and the trainer's bounded wait; DAPO refill in the loop
(local runtime, the real RolloutEngine, fake engines and learner: a few seconds each)."""

import asyncio
import time

import pytest

from agentrl.laminar.buffer import ExperienceBuffer
from agentrl.laminar.loop import TrainingStalled, build_system, shutdown, train
from agentrl.laminar.manager import RolloutManager
from agentrl.laminar.partial import PartialResponsePool
from agentrl.laminar.prompts import PromptPool
from agentrl.laminar.runtime import ActorDied, LocalHandle, LocalRuntime
from agentrl.laminar.types import WorkerLoad
from agentrl.models import load_tokenizer, resolve_model
from agentrl.types import Group

from .helpers import FakeEngine, FakeLearner, check_single_version, make_env, small_config, tail_tasks


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("smollm2-135m"))


class BrokenPull(FakeEngine):
    """Its weight load raises from the first update on: the worker's _drive loop dies."""

    async def load_weights(self, state_dict, version):
        if version >= 1:
            self.failed_at = time.monotonic()
            raise RuntimeError("CUDA error: an illegal memory access (injected)")
        await super().load_weights(state_dict, version)


async def test_a_worker_whose_loop_raises_is_dead_at_once_and_its_work_regenerates(tokenizer):
    cfg = small_config("laminar", **{"laminar.repack_interval_s": 30.0})  # no load poll finds it
    engines = [BrokenPull(tokenizer, seed=0), FakeEngine(tokenizer, seed=1)]
    system = await build_system(cfg, make_env, tail_tasks(2, long_turns=3, tool_s=0.05), engines,
                                LocalRuntime(), shuffle_prompts=False)
    learner = FakeLearner(train_s=0.05)
    detected_at = None

    async def watch() -> None:
        nonlocal detected_at
        while detected_at is None:
            if "worker0" in (await system.manager.get_stats())["dead"]:
                detected_at = time.monotonic()
            await asyncio.sleep(0.01)

    watcher = asyncio.ensure_future(watch())
    try:
        summary = await asyncio.wait_for(train(system, learner, steps=4, batch_groups=2, wait_timeout_s=30), 60)
    finally:
        watcher.cancel()
        await shutdown(system)
    assert summary["final_version"] == 4
    assert summary["dead_workers"] == ["worker0"]
    # its watch call returned: no poll (30 s apart here) had to find it; slack for a loaded machine
    assert detected_at is not None and detected_at - engines[0].failed_at < 0.5
    groups = [g for batch in learner.seen for g in batch]
    check_single_version(groups)
    assert all(len(g.trajectories) == 2 for g in groups)  # no group trained half
    assert engines[0].closed, "the failed worker's engine is closed"


async def test_the_trainer_names_the_dead_workers_when_none_is_left(tokenizer):
    cfg = small_config("laminar")
    engines = [BrokenPull(tokenizer, seed=i) for i in range(2)]
    system = await build_system(cfg, make_env, tail_tasks(2, long_turns=1), engines, LocalRuntime())
    t0 = time.monotonic()
    try:
        with pytest.raises(TrainingStalled, match=r"every rollout worker is dead \(worker\d: .*illegal memory"):
            await train(system, FakeLearner(train_s=0.01), steps=50, batch_groups=2, wait_timeout_s=60)
    finally:
        await shutdown(system)
    assert time.monotonic() - t0 < 20, "fails fast, not at the deadline"


async def test_the_trainer_wait_has_a_deadline(tokenizer):
    cfg = small_config("laminar")
    system = await build_system(cfg, make_env, tail_tasks(1, long_turns=50, tool_s=1.0),
                                [FakeEngine(tokenizer)], LocalRuntime())
    try:
        with pytest.raises(TrainingStalled, match=r"laminar.wait_timeout_s=0.5 s .*alive workers: worker0"):
            await train(system, FakeLearner(), steps=1, batch_groups=2, wait_timeout_s=0.5)
    finally:
        await shutdown(system)


@pytest.mark.parametrize("backend", ["laminar", "sync"])
async def test_dapo_drops_zero_variance_groups_and_refills(tokenizer, backend):
    """Reward is 1 for a long task's trajectories whose id ends in 0, else 0: `L` groups have
    variance, `s` groups none. The loop must train only on `L` groups and count the drops."""
    cfg = small_config(backend)
    system = await build_system(cfg, make_env, tail_tasks(2, long_turns=1), [FakeEngine(tokenizer)],
                                LocalRuntime(), shuffle_prompts=False)
    buf = system.buffer.obj
    orig_write = buf.write

    async def write(traj):
        traj.reward = float(traj.task_id.startswith("L") and traj.id.endswith("/0"))
        return await orig_write(traj)

    buf.write = write
    learner = FakeLearner(train_s=0.01)
    try:
        summary = await asyncio.wait_for(
            train(system, learner, steps=2, batch_groups=2, dynamic_sampling=True, max_gen_batches=10), 60)
    finally:
        await shutdown(system)
    batches: list[list[Group]] = learner.seen
    assert [len(b) for b in batches] == [2, 2]
    assert all(g.trajectories[0].task_id.startswith("L") for b in batches for g in b)
    dropped = [r["dapo_dropped_groups"] for r in summary["records"]]
    assert all(d >= 1 for d in dropped), dropped
    assert all(r["dapo_gen_batches"] >= 2 for r in summary["records"])


class SkipsEmptyBatches(FakeLearner):
    """Like the real learner: a batch with nothing trainable leaves the version as it is."""

    def step(self, groups: list[Group]) -> dict[str, float]:
        if groups:
            return super().step(groups)
        self.seen.append(groups)
        return {"skipped": 1.0, "version": float(self.version)}


async def test_dapo_gives_up_after_max_gen_batches_and_the_run_goes_on(tokenizer):
    """On `sync` a skipped step must still release the next batch (it used to wait forever)."""
    cfg = small_config("sync")
    system = await build_system(cfg, make_env, tail_tasks(1, long_turns=1), [FakeEngine(tokenizer)], LocalRuntime())
    learner = SkipsEmptyBatches()
    try:  # every reward equal: nothing is ever trainable, yet both steps end
        summary = await train(system, learner, steps=2, batch_groups=2, dynamic_sampling=True, max_gen_batches=3)
    finally:
        await shutdown(system)
    assert len(learner.seen) == 2 and learner.seen[0] == []  # the run went on past the empty step
    first = summary["records"][0]
    assert (first["dapo_gen_batches"], first["dapo_dropped_groups"], first["dapo_short_batch"]) == (3, 6, 2)


class Answers:
    """A worker's manager-facing side: its load poll answers, hangs or says the actor died."""

    def __init__(self, name: str, how: str) -> None:
        self.name, self.how, self.stopped = name, how, False

    async def load(self) -> WorkerLoad:
        if self.how == "hangs":
            await asyncio.sleep(3600)
        if self.how == "died":
            raise ActorDied(f"{self.name} is dead")
        return WorkerLoad(self.name, 0, 0, 0, 0.0, 0.0, False, False, time.monotonic())

    async def stop(self) -> None:
        self.stopped = True


async def test_one_heartbeat_deadline_tells_the_hung_and_the_dead_from_the_live():
    workers = {n: Answers(n, how) for n, how in (("w0", "live"), ("w1", "hangs"), ("w2", "died"), ("w3", "live"))}
    manager = RolloutManager(workers, buffer=LocalHandle(ExperienceBuffer(2), "buffer"),
                             prompts=LocalHandle(PromptPool([{"id": "t"}], 2), "prompts"),
                             partial=LocalHandle(PartialResponsePool(), "partial"), heartbeat_timeout_s=0.3)
    t0 = time.monotonic()
    await manager.check(repack=False)
    assert time.monotonic() - t0 < 5.0  # the hung worker's call was given up at the deadline
    assert sorted(manager.loads) == ["w0", "w3"] and manager.dead == ["w1", "w2"]
    assert manager.failures == {"w1": "no heartbeat within 0.3 s", "w2": "w2 is dead"}
    assert workers["w1"].stopped and workers["w2"].stopped


class Watched:
    """A worker's manager-facing side that counts the loads read from it."""

    def __init__(self, name: str) -> None:
        self.name, self.loads, self.ended = name, 0, asyncio.Event()

    async def load(self) -> WorkerLoad:
        self.loads += 1
        return WorkerLoad(self.name, 0, 0, 0, 0.0, 0.0, False, False, time.monotonic())

    async def watch(self) -> str:
        await self.ended.wait()
        return f"{self.name} stopped"

    async def stop(self) -> None:
        self.ended.set()


async def test_a_death_reaches_the_manager_through_its_watch_with_no_load_poll():
    """Deaths are pushed: a killed worker is recovered at once, and no worker's load is read
    between repack checks (a poll per worker per tick was the controller's largest cost at 1,024
    workers, bench/controller.py)."""
    runtime = LocalRuntime()
    workers = {n: runtime.spawn(Watched, n, name=n) for n in ("w0", "w1", "w2")}
    manager = RolloutManager(workers, buffer=LocalHandle(ExperienceBuffer(2), "buffer"),
                             prompts=LocalHandle(PromptPool([{"id": "t"}], 2), "prompts"),
                             partial=LocalHandle(PartialResponsePool(), "partial"), repack_interval_s=60.0)
    await manager.start()
    try:
        await asyncio.sleep(0.05)
        await runtime.kill(workers["w1"])
        for _ in range(200):
            if manager.dead:
                break
            await asyncio.sleep(0.01)
        assert manager.dead == ["w1"] and manager.failures == {"w1": "w1 died during watch"}
        assert sorted((await manager.get_stats())["alive"]) == ["w0", "w2"]
        assert [w.obj.loads for w in workers.values()] == [0, 0, 0]
    finally:
        await manager.stop()
