"""Rollout-engine logic with a character tokenizer, a scripted engine and scripted envs.
The same behaviours run against the real model, template and sandbox in test_real_model.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import weakref

import pytest

from agentrl.envs.summarize import SupoPolicy
from agentrl.inference.base import SamplingParams
from agentrl.rollout import RolloutEngine, RolloutState, step_seed, trajectory_seed
from agentrl.rollout.tokens import ChatTokens
from agentrl.types import Status, Trajectory

from .fakes import CharTokenizer, ScriptedEngine, ScriptedEnv, fake_logprob

TASK = {"id": "t1", "prompt": "Add two numbers."}


def make_rollout(engine: ScriptedEngine | None = None, **kw) -> RolloutEngine:
    tok = CharTokenizer()
    sampling = kw.pop("sampling", SamplingParams(seed=7, max_tokens=64))
    return RolloutEngine(engine or ScriptedEngine(tok), tok, sampling, **kw)


def assert_same(a: Trajectory, b: Trajectory, atol: float = 1e-5) -> None:
    assert len(a.segments) == len(b.segments)
    for sa, sb in zip(a.segments, b.segments):
        assert sa.token_ids == sb.token_ids
        assert sa.loss_mask == sb.loss_mask
        assert sa.versions == sb.versions
        assert sa.prompt_len == sb.prompt_len
        assert max((abs(x - y) for x, y in zip(sa.logprobs, sb.logprobs)), default=0.0) <= atol
    assert a.step_rewards == b.step_rewards
    assert (a.outcome_reward, a.reward_components, a.status) == (b.outcome_reward, b.reward_components, b.status)
    assert a.messages == b.messages


async def test_group_trajectories_are_token_exact_and_complete() -> None:
    tok = CharTokenizer()
    engine = ScriptedEngine(tok, version=3)
    rollout = make_rollout(engine)
    group = await rollout.run_group(lambda: ScriptedEnv(turns=3, outcome=1.0), TASK, 3, group_id="g")
    assert group.id == "g" and group.task_id == "t1" and len(group.trajectories) == 3
    assert group.version == 3
    chat = ChatTokens(tok)
    for traj in group.trajectories:
        assert traj.status is Status.FINISHED and traj.error is None
        assert traj.group_id == "g" and traj.task_id == "t1" and traj.env == "scripted"
        assert traj.num_turns == 3 and len(traj.segments) == 1
        seg = traj.segments[0]
        seg.check()
        # The token context is exactly the template's rendering of the transcript (the last
        # assistant turn is left open: its "\n" closing is never generated).
        assert tok.decode(seg.token_ids) + "\n" == chat.render(traj.messages)
        assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant",
                                                       "tool", "assistant"]
        assert seg.prompt_len == len(chat.prompt(traj.messages[:2]))
        for turn in seg.turns:
            policy = range(turn.action_start, turn.action_end)
            assert all(seg.loss_mask[i] == 1 and seg.versions[i] == 3 for i in policy)
            assert tok.decode(seg.token_ids[turn.action_start:turn.action_end]) == turn.action_text + "<|im_end|>"
            assert turn.finish_reason == "stop" and turn.generate_seconds > 0
        # Behaviour log-probs are the engine's, position by position.
        seed = trajectory_seed(7, traj.id)
        for k, turn in enumerate(seg.turns):
            prompt, params = next(c for c in engine.calls if c[1].seed == step_seed(seed, k))
            assert prompt == seg.token_ids[:turn.action_start]
            n = turn.action_end - turn.action_start
            assert seg.logprobs[turn.action_start:turn.action_end] == [fake_logprob(prompt, i, params.seed)
                                                                     for i in range(n)]
        # Everything that is not a policy token has mask 0, log-prob 0 and version -1.
        env_pos = [i for i, m in enumerate(seg.loss_mask) if m == 0]
        assert all(seg.logprobs[i] == 0.0 and seg.versions[i] == -1 for i in env_pos)
        assert seg.num_policy_tokens == sum(t.action_end - t.action_start for t in seg.turns)
        obs = seg.turns[0]
        assert tok.decode(seg.token_ids[obs.obs_start:obs.obs_end]).startswith("\n<|im_start|>tool\n")
        assert traj.step_rewards == pytest.approx([0.15, 0.2, 0.25])
        assert [t.step_reward for t in seg.turns] == traj.step_rewards
        assert traj.outcome_reward == 1.0 and traj.reward == 1.0 and traj.reward_components == {"tests": 1.0}
        assert {"generate_s", "env_s", "total_s", "queue_s"} <= set(traj.timings)
        assert traj.timings["total_s"] >= traj.timings["generate_s"]
    # Distinct per-trajectory seeds: a GRPO group is not G copies of one sample.
    assert len({t.messages[2]["content"] for t in group.trajectories}) == 3


async def test_seeded_groups_are_reproducible() -> None:
    a = await make_rollout().run_group(lambda: ScriptedEnv(), TASK, 2, group_id="same")
    b = await make_rollout().run_group(lambda: ScriptedEnv(), TASK, 2, group_id="same")
    for x, y in zip(a.trajectories, b.trajectories):
        assert_same(x, y, atol=0.0)


async def test_max_tokens_without_eos_appends_eos_as_env_token() -> None:
    tok = CharTokenizer()
    engine = ScriptedEngine(tok, reply=lambda p, n, s: "a very long action that will be cut")
    rollout = make_rollout(engine, sampling=SamplingParams(seed=1, max_tokens=6))
    traj = (await rollout.run_group(lambda: ScriptedEnv(turns=2), TASK, 1)).trajectories[0]
    seg = traj.segments[0]
    turn = seg.turns[0]
    assert turn.finish_reason == "length" and turn.action_end - turn.action_start == 6
    assert seg.token_ids[turn.obs_start] == tok.eos_token_id and seg.loss_mask[turn.obs_start] == 0
    assert seg.turns[1].finish_reason == "length"  # the last action is cut too: nothing follows it
    assert tok.decode(seg.token_ids) + "<|im_end|>\n" == ChatTokens(tok).render(traj.messages)


async def test_concurrency_is_bounded() -> None:
    active = peak = 0

    class Counting(ScriptedEnv):
        async def areset(self, task):
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            return await super().areset(task)

        async def aclose(self):
            nonlocal active
            active -= 1

    rollout = make_rollout(ScriptedEngine(CharTokenizer(), delay=0.01), concurrency=2)
    group = await rollout.run_group(lambda: Counting(turns=2), TASK, 6)
    assert peak == 2 and active == 0
    assert all(t.status is Status.FINISHED for t in group.trajectories)


async def test_failing_env_ends_only_its_trajectory() -> None:
    envs: list[ScriptedEnv] = []

    def factory() -> ScriptedEnv:
        env = ScriptedEnv(turns=3, fail_at=2 if len(envs) == 1 else None)
        envs.append(env)
        return env

    group = await make_rollout().run_group(factory, TASK, 4, group_id="g")
    statuses = [t.status for t in group.trajectories]
    assert statuses == [Status.FINISHED, Status.ERROR, Status.FINISHED, Status.FINISHED]
    bad = group.trajectories[1]
    assert "env broke at turn 2" in bad.error and not bad.status.trainable
    assert bad.num_turns == 2 and bad.segments[0].turns[1].obs_end == 0  # no obs after the failure
    assert all(e.closed for e in envs)


async def test_env_factory_failure_is_an_error_status() -> None:
    def factory():
        raise OSError("no sandbox available")

    group = await make_rollout().run_group(factory, TASK, 2)
    assert [t.status for t in group.trajectories] == [Status.ERROR, Status.ERROR]
    assert "no sandbox available" in group.trajectories[0].error


async def test_bad_env_return_is_an_error_status() -> None:
    class Bad(ScriptedEnv):
        async def astep(self, action):
            return {"observation": []}

    traj = (await make_rollout().run_group(Bad, TASK, 1)).trajectories[0]
    assert traj.status is Status.ERROR and "StepResult" in traj.error


async def test_wall_clock_budget_aborts_and_closes_env() -> None:
    envs: list[ScriptedEnv] = []

    def factory() -> ScriptedEnv:
        envs.append(ScriptedEnv(turns=5, step_delay=0.3))
        return envs[-1]

    group = await make_rollout(trajectory_timeout_s=0.5).run_group(factory, TASK, 2)
    for t in group.trajectories:
        assert t.status is Status.ABORTED and "wall-clock budget" in t.error
        assert 0.4 < t.timings["total_s"] < 1.5
    assert all(e.closed for e in envs)


async def test_cancel_aborts_one_trajectory() -> None:
    rollout = make_rollout()
    run = asyncio.ensure_future(rollout.run_group(lambda: ScriptedEnv(turns=4, step_delay=0.05), TASK, 2,
                                                  group_id="g"))
    await asyncio.sleep(0.02)
    assert sorted(rollout.in_flight) == ["g/0", "g/1"]
    assert rollout.cancel("g/1") and not rollout.cancel("nope")
    group = await run
    assert [t.status for t in group.trajectories] == [Status.FINISHED, Status.ABORTED]
    assert group.trajectories[1].error == "cancelled"
    assert rollout.in_flight == []


async def test_context_overflow_truncates() -> None:
    tok = CharTokenizer()
    rollout = make_rollout(ScriptedEngine(tok), max_context_tokens=200)
    traj = (await rollout.run_group(lambda: ScriptedEnv(turns=10), TASK, 1)).trajectories[0]
    assert traj.status is Status.TRUNCATED and traj.metrics.get("truncated_context") == 1.0
    assert traj.status.trainable and 0 < traj.num_turns < 10
    assert len(traj.segments[0].token_ids) <= 200


async def test_env_truncation_is_truncated_with_outcome() -> None:
    class Trunc(ScriptedEnv):
        async def astep(self, action):
            r = await super().astep(action)
            r.truncated, r.terminated = r.terminated, False
            return r

    traj = (await make_rollout().run_group(lambda: Trunc(turns=2, outcome=0.5), TASK, 1)).trajectories[0]
    assert traj.status is Status.TRUNCATED and traj.outcome_reward == 0.5


async def test_stream_yields_in_completion_order_and_cleans_up() -> None:
    envs: list[ScriptedEnv] = []

    def factory() -> ScriptedEnv:
        envs.append(ScriptedEnv(turns=2, step_delay=[0.15, 0.01, 0.08][len(envs) % 3]))
        return envs[-1]

    rollout = make_rollout(concurrency=8)
    order = [t.id async for t in rollout.stream(factory, [{"id": "a"}], 3)]
    assert order == ["a-1/1", "a-1/2", "a-1/0"]
    # Leaving early (and closing the generator) cancels the rest; their envs are closed.
    envs.clear()
    async with contextlib.aclosing(rollout.stream(factory, [{"id": "b"}, {"id": "c"}], 3)) as stream:
        async for _ in stream:
            break
    assert len(envs) == 6 and all(e.closed for e in envs) and rollout.in_flight == []


async def test_run_groups_keeps_task_order() -> None:
    groups = await make_rollout().run_groups(lambda: ScriptedEnv(turns=1), [{"id": "x"}, {"id": "y"}], 2)
    assert [g.task_id for g in groups] == ["x", "y"] and all(len(g.trajectories) == 2 for g in groups)


async def test_progress_hook_sees_growing_token_counts() -> None:
    seen: list[tuple[str, int]] = []
    rollout = make_rollout(on_progress=lambda tid, n: seen.append((tid, n)))
    traj = (await rollout.run_group(lambda: ScriptedEnv(turns=3), TASK, 1, group_id="p")).trajectories[0]
    counts = [n for tid, n in seen if tid == "p/0"]
    assert len(counts) == 5  # 3 generations + 2 observations
    assert counts == sorted(counts) and counts[-1] == traj.num_tokens


async def _export_after_turn(rollout: RolloutEngine, turn: int, group_id: str) -> RolloutState:
    exports: dict[str, asyncio.Future] = {}
    calls: dict[str, int] = {}

    def hook(tid: str, n: int) -> None:
        calls[tid] = calls.get(tid, 0) + 1
        if calls[tid] == 2 * turn:  # after the turn's observation was appended
            exports[tid] = rollout.request_export(tid)

    rollout.on_progress = hook
    group = await rollout.run_group(lambda: ScriptedEnv(turns=3), TASK, 1, group_id=group_id)
    assert group.trajectories == []  # it left this engine
    state = await exports[f"{group_id}/0"]
    assert state is not None and state.turn == turn and state.env is not None
    return state


async def test_export_resume_equals_unmoved_trajectory() -> None:
    reference = (await make_rollout().run_group(lambda: ScriptedEnv(turns=3), TASK, 1,
                                                group_id="m")).trajectories[0]
    state = await _export_after_turn(make_rollout(), 1, "m")
    assert state.trajectory.status is Status.RUNNING and state.trajectory.num_turns == 1
    other = make_rollout()  # another RolloutEngine over another engine object
    moved = await other.resume(state)
    assert moved is not None
    assert_same(moved, reference)
    assert state.env.closed  # the env is closed where the trajectory finished


async def test_export_resume_across_processes_replays_the_env() -> None:
    reference = (await make_rollout().run_group(lambda: ScriptedEnv(turns=3), TASK, 1,
                                                group_id="x")).trajectories[0]
    state = await _export_after_turn(make_rollout(), 2, "x")
    await state.env.aclose()
    wire = json.loads(json.dumps(state.to_dict()))  # what crosses a process boundary
    restored = RolloutState.from_dict(wire)
    assert restored.env is None and restored.actions == state.actions
    with pytest.raises(ValueError, match="env_factory"):
        await make_rollout().resume(restored)
    moved = await make_rollout().resume(restored, env_factory=lambda: ScriptedEnv(turns=3))
    assert_same(moved, reference)


async def test_export_of_unknown_or_finished_trajectory() -> None:
    rollout = make_rollout()
    with pytest.raises(KeyError, match="no trajectory"):
        await rollout.export("missing")
    run = asyncio.ensure_future(rollout.run_group(lambda: ScriptedEnv(turns=1), TASK, 1, group_id="f"))
    while not rollout.in_flight:
        await asyncio.sleep(0)
    fut = rollout.request_export("f/0")
    group = await run
    # It either paused before its only turn or finished first; never both, never lost.
    state = await fut
    assert (state is None) == (len(group.trajectories) == 1)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"concurrency": 0}, "concurrency"),
    ({"trajectory_timeout_s": 0}, "trajectory_timeout_s"),
    ({"max_context_tokens": 1}, "max_context_tokens"),
])
def test_bad_settings_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_rollout(**kwargs)


async def test_bad_group_arguments_are_named() -> None:
    rollout = make_rollout()
    with pytest.raises(ValueError, match="group size"):
        await rollout.run_group(ScriptedEnv, TASK, 0)
    with pytest.raises(TypeError, match="task must be a dict"):
        await rollout.run_group(ScriptedEnv, "t1", 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="env_factory must be callable"):
        await rollout.run_group(ScriptedEnv(), TASK, 2)


async def test_snapshot_copies_in_flight_trajectory() -> None:
    rollout = make_rollout()
    snaps: list[Trajectory] = []
    rollout.on_progress = lambda tid, n: snaps.append(rollout.snapshot(tid))
    traj = (await rollout.run_group(lambda: ScriptedEnv(turns=2), TASK, 1)).trajectories[0]
    assert [s.num_tokens for s in snaps] == sorted(s.num_tokens for s in snaps)
    assert snaps[-1].num_tokens == traj.num_tokens and snaps[-1].status is Status.RUNNING
    assert snaps[0] is not traj and snaps[0].segments[0].token_ids != traj.segments[0].token_ids
    with pytest.raises(KeyError):
        rollout.snapshot(traj.id)


async def test_weight_version_switch_is_flagged() -> None:
    tok = CharTokenizer()
    engine = ScriptedEngine(tok, version=1)

    async def bump(tid: str, n: int) -> None:
        engine.version = 2  # weights swapped under a running trajectory

    traj = (await make_rollout(engine, on_progress=bump).run_group(lambda: ScriptedEnv(turns=2), TASK, 1)
            ).trajectories[0]
    assert traj.metrics["version_switches"] == 1.0 and traj.policy_versions == {1, 2}
    with pytest.raises(ValueError, match="mixes weight versions"):
        _ = traj.version


async def test_engine_abort_ends_aborted() -> None:
    tok = CharTokenizer()

    class Aborting(ScriptedEngine):
        async def generate(self, prompt_ids, sampling):
            out = await super().generate(prompt_ids, sampling)
            out.finish_reason = "abort"
            return out

    traj = (await make_rollout(Aborting(tok)).run_group(ScriptedEnv, TASK, 1)).trajectories[0]
    assert traj.status is Status.ABORTED and "aborted the generation" in traj.error


async def test_timeout_error_from_env_is_an_error_not_the_budget() -> None:
    class SlowTool(ScriptedEnv):
        async def astep(self, action):
            raise TimeoutError("tool server timed out")

    traj = (await make_rollout(trajectory_timeout_s=30).run_group(SlowTool, TASK, 1)).trajectories[0]
    assert traj.status is Status.ERROR and "tool server timed out" in traj.error


def test_from_config_reads_sampling_and_rollout_and_takes_a_context_policy() -> None:
    from agentrl.config import load_config

    cfg = load_config(overrides=["rollout.concurrency=3", "sampling.max_tokens=17", "run.seed=9",
                                 "summarize.enabled=true", "summarize.working_context=512"])
    tok = CharTokenizer()
    policy = SupoPolicy.from_config(cfg.summarize)
    rollout = RolloutEngine.from_config(ScriptedEngine(tok), tok, cfg, context_policy=policy)
    assert rollout.concurrency == 3 and rollout.sampling.max_tokens == 17 and rollout.sampling.seed == 9
    assert rollout.context_policy.working_context == 512 and rollout.context_policy.threshold == 486
    with pytest.raises(TypeError, match="ContextPolicy"):
        RolloutEngine(ScriptedEngine(tok), tok, context_policy=cfg.summarize)


async def test_failing_progress_hook_does_not_end_trajectories(caplog) -> None:
    def hook(tid: str, n: int) -> None:
        raise RuntimeError("pool is down")

    traj = (await make_rollout(on_progress=hook).run_group(ScriptedEnv, TASK, 1)).trajectories[0]
    assert traj.status is Status.FINISHED and "pool is down" in caplog.text


async def test_stream_checks_every_task_before_starting_any() -> None:
    started: list[ScriptedEnv] = []
    rollout = make_rollout()
    with pytest.raises(TypeError, match="task must be a dict"):
        async for _ in rollout.stream(lambda: started.append(ScriptedEnv()) or started[-1], [TASK, "bad"], 2):
            pass
    assert started == [] and rollout.in_flight == []



async def test_context_cut_is_scored_by_the_env() -> None:
    """A trajectory the rollout cuts (context budget) still gets the env's outcome for its state,
    so running out of context cannot beat a bad ending (SWE: no submit = -1)."""

    class Scored(ScriptedEnv):
        finalized = 0

        async def afinalize(self) -> tuple[float, dict[str, float]]:
            self.finalized += 1
            return -1.0, {"reward": -1.0, "submitted": 0.0}

    envs: list[Scored] = []

    def factory() -> Scored:
        envs.append(Scored(turns=10))
        return envs[-1]

    rollout = make_rollout(ScriptedEngine(CharTokenizer()), max_context_tokens=200)
    traj = (await rollout.run_group(factory, TASK, 1)).trajectories[0]
    assert traj.status is Status.TRUNCATED and traj.metrics.get("truncated_context") == 1.0
    assert traj.outcome_reward == -1.0 and traj.reward_components == {"reward": -1.0, "submitted": 0.0}
    assert envs[0].finalized == 1
    # an env that ends the episode itself is not asked again
    done = (await make_rollout().run_group(factory, TASK, 1)).trajectories[0]
    assert done.status is Status.FINISHED and envs[1].finalized == 0


async def test_a_finished_trajectory_leaves_no_reference_cycle() -> None:
    """Its env and state are freed when it ends, not at the next full garbage collection: the
    ending raised through the rollout's frames would otherwise keep them in a cycle (at 1,024
    workers the collector's full passes over them cost more than the controller's own work)."""
    envs: list[weakref.ref] = []

    def make_env() -> ScriptedEnv:
        env = ScriptedEnv(turns=2, outcome=1.0)
        envs.append(weakref.ref(env))
        return env

    rollout = make_rollout()
    gc.disable()
    try:
        group = await rollout.run_group(make_env, TASK, 2, group_id="g")
        assert all(t.status is Status.FINISHED for t in group.trajectories)
        await asyncio.sleep(0)
        assert len(envs) == 2 and [r() for r in envs] == [None, None], "an env outlived its trajectory"
    finally:
        gc.enable()
