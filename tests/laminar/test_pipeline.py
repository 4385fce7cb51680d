"""The Laminar pipeline on the local runtime with the real RolloutEngine, a fast fake inference
engine and a fake learner (logic tests; test_integration.py uses the real model and learner)."""

import asyncio
import contextlib
import gc
import os
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agentrl.inference.cpu.policy import LearnerStepPolicy, learner_mmap_threshold, learner_threads
from agentrl.laminar.loop import (
    GC_THRESHOLDS,
    build_system,
    collector_for_a_long_run,
    resolve_backend,
    shutdown,
    train,
)
from agentrl.laminar.runtime import LocalRuntime
from agentrl.models import load_tokenizer, resolve_model
from agentrl.types import Status

from .helpers import (
    FakeEngine,
    FakeLearner,
    check_single_version,
    kill_first_busy_worker,
    make_env,
    small_config,
    tail_tasks,
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("smollm2-135m"))


async def _system(tokenizer, backend="laminar", tasks=None, n_workers=2, **cfg_over):
    cfg = small_config(backend, **cfg_over)
    engines = [FakeEngine(tokenizer, seed=i) for i in range(n_workers)]
    rt = LocalRuntime()
    system = await build_system(cfg, make_env, tasks or tail_tasks(), engines, rt, shuffle_prompts=False)
    return cfg, system, engines, rt


def _form(t):
    return (t.status, len(t.segments), t.num_turns, sorted(t.timings), t.version is not None,
            [seg.check() for seg in t.segments])


async def test_laminar_versions_advance_single_version_and_repack(tokenizer):
    # worker0 takes s0,L0 and worker1 s1,L1: both drain into one long tail each, and (padded
    # shorts) both stay below their plateau for the tail's whole life, so the move is certain
    tasks = tail_tasks(2, long_turns=10, tool_s=0.1, short_pad_words=400)
    _cfg, system, engines, _ = await _system(tokenizer, tasks=tasks)
    learner = FakeLearner(train_s=0.3)
    try:
        summary = await train(system, learner, steps=5, batch_groups=2)
    finally:
        await shutdown(system)
    assert summary["final_version"] == 5
    groups = [g for batch in learner.seen for g in batch]
    check_single_version(groups)
    assert all(len(g.trajectories) == 2 for g in groups)
    # every engine only ever loaded weights that match their version tag (probe == version)
    for e in engines:
        assert all(v == probe for v, probe in e.loaded)
        assert [v for v, _ in e.loaded] == sorted(v for v, _ in e.loaded)
    # the trainer never waited for the broadcast: its stall is the push copy
    assert max(summary["push_stall_s"]) < 0.5
    # repack moved the long tail of one worker onto the other
    assert summary["repack_moves"] >= 1, summary["moves"]
    moved_ids = {t for m in summary["moves"] for t in m["trajectories"]}
    trained = {t.id: t for g in groups for t in g.trajectories}
    moved = [trained[i] for i in moved_ids if i in trained]
    unmoved_long = [t for t in trained.values() if t.task_id.startswith("L") and t.id not in moved_ids]
    assert moved and unmoved_long
    for t in moved:
        assert t.status == Status.FINISHED and t.num_turns == 10
        assert _form(t) == _form(unmoved_long[0])
    assert max(summary["staleness_hist"]) >= 1  # the tail finished after updates


async def test_fault_worker_killed_mid_run(tokenizer):
    _cfg, system, _engines, rt = await _system(tokenizer, tasks=tail_tasks(2, long_turns=12, tool_s=0.1))
    learner = FakeLearner(train_s=0.3)
    killed: dict = {}
    kill_busy_worker = kill_first_busy_worker(system, rt.kill, killed)

    try:
        summary = await asyncio.wait_for(train(system, learner, steps=8, batch_groups=2,
                                               on_step=kill_busy_worker), 60)
    finally:
        await shutdown(system)
    assert killed and killed["lost"]
    assert summary["dead_workers"] == [killed["name"]]
    assert summary["final_version"] == 8
    assert summary["restarted"] + summary["regenerated_groups"] >= 1
    groups = [g for batch in learner.seen for g in batch]
    check_single_version(groups)
    assert all(len(g.trajectories) == 2 for g in groups)  # no group consumed half
    ids = [t.id for g in groups for t in g.trajectories]
    assert len(ids) == len(set(ids))
    buf = summary["buffer"]
    # counts add up: every written trajectory was consumed, is waiting, or was dropped/evicted
    assert buf["trajectories_written"] == (buf["trajectories_consumed"] + buf.get("trajectories_dropped", 0)
                                           + buf.get("trajectories_evicted", 0) + buf["ready_trajectories"]
                                           + buf["pending_trajectories"])
    # the lost trajectories were regenerated: restarted ones were consumed under the same id
    # or their group was regenerated whole under a fresh id
    regenerated = {g.id.split("~r")[0] for g in groups if "~r" in g.id}
    for lost in killed["lost"]:
        assert lost in ids or lost.rsplit("/", 1)[0] in regenerated, (lost, ids)
    survivor = next(s for n, s in summary["workers"].items() if n != killed["name"])
    assert survivor["restarted"] == summary["restarted"]


def _record_cores(engine, learner) -> dict[str, list[str]]:
    """Give a fake engine `all_cores` and `own_cores` (as HFEngine has); returns the share of the
    cores it was on ("all", "own" or "default") at each generate call and each learner step."""
    state, seen = ["default"], {"generate": [], "learn": []}

    def share(name: str):
        @contextlib.contextmanager
        def cores():
            previous, state[0] = state[0], name
            try:
                yield
            finally:
                state[0] = previous
        return cores

    real_generate, real_step = engine.generate, learner.step

    async def generate(*args, **kwargs):
        seen["generate"].append(state[0])
        return await real_generate(*args, **kwargs)

    def step(groups):
        seen["learn"].append(state[0])
        return real_step(groups)

    engine.all_cores, engine.own_cores, engine.generate, learner.step = share("all"), share("own"), generate, step
    return seen


async def _train_checked(system, learner, steps: int) -> tuple[dict, list[int]]:
    """Train 2-group batches, shut down; every trained group has one version. Returns the
    summary and each trained trajectory's staleness (updates between generation and training)."""
    try:
        summary = await asyncio.wait_for(train(system, learner, steps=steps, batch_groups=2), 60)
    finally:
        await shutdown(system)
    groups = [g for batch in learner.seen for g in batch]
    check_single_version(groups)
    return summary, [t.consumed_version - t.version for g in groups for t in g.trajectories]


def _on_fresh_thread(fn: Callable[[], Any]) -> Any:
    """fn's result on a new thread: one that never set its own torch thread count."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def _set_default_threads(count: int) -> None:
    _on_fresh_thread(lambda: torch.set_num_threads(count))


@pytest.mark.parametrize("backend,max_stale", [("sync", 0), ("global-async", 1)])
async def test_baselines(tokenizer, backend, max_stale, monkeypatch):
    _cfg, system, engines, _ = await _system(tokenizer, backend, tasks=tail_tasks(2, long_turns=3, tool_s=0.05),
                                             n_workers=1)
    engines[0].num_threads = 1  # as HFEngine's on 2 cores: the learner takes the rest beside it
    mapped_steps = []  # heap.mapped_tensors is process-wide: only when no engine decodes beside the step
    monkeypatch.setattr("agentrl.inference.cpu.policy.mapped_tensors", lambda threshold: mapped_steps.append(threshold) or contextlib.nullcontext())
    learner = FakeLearner()
    cores_seen = _record_cores(engines[0], learner)
    # a set on a thread that never had its own count moves the default of threads started later
    # (the learner's executor thread): the step's count must not depend on it
    cores = os.cpu_count() or 1
    default_threads = _on_fresh_thread(torch.get_num_threads)
    _set_default_threads(1)
    try:
        summary, consumed = await _train_checked(system, learner, steps=4)
    finally:
        _set_default_threads(default_threads)
    assert summary["final_version"] == 4
    # taking turns, the learner takes every core; beside the decoding engine, the cores it leaves
    assert learner.threads == [cores if backend == "sync" else max(1, cores - 1)] * 4
    assert max(consumed) == max_stale
    assert summary["repack_moves"] == 0 or backend == "laminar"
    # stop the world: after each update every engine runs the new version before new work
    for e in engines:
        assert [v for v, _ in e.loaded] == list(range(1, len(e.loaded) + 1))
    # the lone engine decodes on every core, except that beside a learner step (one-step-off
    # overlaps the update; sync takes turns) it goes back to its own share
    assert cores_seen["generate"] and set(cores_seen["generate"]) <= {"all", "own"} and "all" in cores_seen["generate"]
    assert cores_seen["learn"] == ["all" if backend == "sync" else "own"] * 4
    # nothing is generated past the last step: every group written was trained on
    assert summary["buffer"]["groups_written"] == summary["buffer"]["groups_consumed"] == 4 * 2
    assert mapped_steps == ([128 << 10] * 4 if backend == "sync" else [])


class EveryOtherLearner(FakeLearner):
    """Updates on even steps only: an odd step's batch has no advantage (every group's rewards
    equal), so the weights and the version stay, as `Learner.nothing_to_learn` does."""

    def step(self, groups):
        metrics = super().step(groups)
        if len(self.seen) % 2 == 0:
            self.version -= 1
        return metrics


async def test_one_step_off_starts_the_batch_after_next_beside_the_next_when_an_update_is_skipped(tokenizer):
    # room for two batches (rollout.concurrency 8, 4 trajectories a batch); long multi-turn
    # trajectories keep a batch generating while the trainer finishes a step
    _cfg, system, engines, _ = await _system(tokenizer, "global-async", n_workers=1,
                                             tasks=tail_tasks(4, long_turns=4, tool_s=0.05),
                                             **{"rollout.concurrency": 8})
    engine, active, peak = engines[0], [0], [0]
    real = engine.generate

    async def generate(*args, **kwargs):  # trajectories mid-generation at once (one call each)
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        try:
            return await real(*args, **kwargs)
        finally:
            active[0] -= 1

    engine.generate = generate
    summary, consumed = await _train_checked(system, EveryOtherLearner(), steps=6)
    assert summary["final_version"] == 3
    assert peak[0] > 4  # two batches shared the engine
    assert max(consumed) == 1  # still one-step-off: at most one update between generation and training
    assert summary["buffer"]["groups_written"] == summary["buffer"]["groups_consumed"] == 6 * 2
    assert [v for v, _ in engine.loaded] == [1, 2, 3]  # each update loaded once, in order


async def test_a_laminar_worker_takes_work_only_when_empty(tokenizer):
    # the same room for two batches, but Laminar's workers pull the newest weights before new work
    _cfg, system, _engines, _ = await _system(tokenizer, "laminar", n_workers=1,
                                             tasks=tail_tasks(4, long_turns=4, tool_s=0.05),
                                             **{"rollout.concurrency": 8})
    worker = system.workers["worker0"].obj
    assert worker.top_up_trajectories == 0
    inflight_at_take: list[int] = []
    real_take = system.prompts.obj.take

    async def take(n, version):
        inflight_at_take.append(len(worker._inflight))
        return await real_take(n, version)

    system.prompts.obj.take = take
    try:
        await asyncio.wait_for(train(system, FakeLearner(), steps=3, batch_groups=2), 60)
    finally:
        await shutdown(system)
    assert inflight_at_take and set(inflight_at_take) == {0}


def test_learner_threads_are_the_cores_the_engines_leave_where_they_decode_beside_the_step() -> None:
    assert learner_threads("global-async", 1, 2) == 1
    assert learner_threads("laminar", 2, 8) == 6
    assert learner_threads("laminar", 4, 2) == 1  # never none
    assert learner_threads("sync", 1, 2) == 2  # taking turns: every core
    assert learner_threads("global-async", 0, 2) == 2  # no in-process engine (Ray, remote)


def test_learner_step_mmap_threshold_is_the_configured_one_or_automatic() -> None:
    # automatic: mapped at 128 KiB only where no in-process engine decodes beside the step
    assert learner_mmap_threshold("sync", True, None) == 128 << 10
    assert learner_mmap_threshold("global-async", False, None) == 128 << 10
    assert learner_mmap_threshold("global-async", True, None) is None
    assert learner_mmap_threshold("laminar", True, None) is None
    # trainer.mmap_threshold_mb wins on every backend
    assert learner_mmap_threshold("global-async", True, 2) == 2 << 20
    assert learner_mmap_threshold("sync", True, 0.5) == 512 << 10


def test_the_learner_step_policy_takes_an_idle_lone_engines_cores_back(monkeypatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    engine = SimpleNamespace(own_threads=1, decoding=True)
    model = torch.nn.Linear(2, 2)
    policy = LearnerStepPolicy.for_run("global-async", [engine], model)
    assert policy.threads == 3 and policy.mmap_threshold is None and policy.elastic is not None
    assert policy.elastic() == 3  # the engine decodes: its core stays its own
    engine.decoding = False
    assert policy.elastic() == 4  # it idles: the step takes every core
    sync = LearnerStepPolicy.for_run("sync", [engine], model)  # taking turns: every core, mapped, fixed
    assert (sync.threads, sync.mmap_threshold, sync.elastic) == (4, 128 << 10, None)
    remote = LearnerStepPolicy.for_run("laminar", [], None)  # engines and learner elsewhere (Ray, vLLM)
    assert (remote.threads, remote.mmap_threshold, remote.elastic) == (4, 128 << 10, None)


def test_run_training_entry_point(tokenizer, monkeypatch):
    from agentrl.laminar import run_training

    cfg = small_config("laminar", **{"trainer.steps": 2, "trainer.mmap_threshold_mb": 2})
    steps = []
    thresholds = []  # the configured threshold reaches each learner step, even beside in-process engines
    monkeypatch.setattr("agentrl.inference.cpu.policy.mapped_tensors",
                        lambda threshold: thresholds.append(threshold) or contextlib.nullcontext())
    summary = run_training(cfg, make_env, tail_tasks(2, long_turns=2, tool_s=0.01),
                           FakeLearner(train_s=0.01), [FakeEngine(tokenizer, seed=i) for i in range(2)],
                           on_step=steps.append)
    assert [r["step"] for r in steps] == [0, 1] and summary["final_version"] == 2
    assert thresholds == [2 << 20] * 2
    assert summary["trajectories_trained"] == 2 * 2 * 2
    assert set(summary) >= {"trainer_idle_s", "rollout_idle_s", "staleness_hist", "repack_moves",
                            "weight_pull_s", "push_stall_s"}
    import json

    json.dumps({k: v for k, v in summary.items() if k != "workers"})  # the CLI can log it


@pytest.mark.parametrize(("backend", "workers", "runtime", "expected"), [
    ("auto", 1, "local", "global-async"), ("auto", 2, "local", "laminar"), ("auto", 1, "ray", "laminar"),
    ("laminar", 1, "local", "laminar"), ("sync", 4, "ray", "sync")])
def test_auto_backend_is_one_step_off_for_one_local_worker(backend, workers, runtime, expected):
    assert resolve_backend(backend, workers, runtime) == expected


def test_the_training_loop_sets_the_collector_for_a_long_run_and_restores_it() -> None:
    before = gc.get_threshold()
    with collector_for_a_long_run():
        assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
