"""SUPO summarisation (algorithms.md §4): the SummarizeEnv wrapper and the rollout mechanics."""

from __future__ import annotations

import re

import pytest
import torch

from agentrl.config import SummarizeConfig
from agentrl.env import Env, make, register
from agentrl.envs.summarize import (
    CONTINUATION_TEMPLATE,
    SUMMARY_PROMPT,
    SummarizeEnv,
    SupoPolicy,
    continuation_messages,
    extract_summary,
    summary_threshold,
)
from agentrl.inference.base import SamplingParams
from agentrl.rollout import RolloutEngine
from agentrl.rollout.tokens import ChatTokens
from agentrl.trainer.advantages import supo_advantages
from agentrl.types import Status, StepResult, Trajectory

from .fakes import CharTokenizer, ScriptedEngine, ScriptedEnv

TASK = {"id": "long", "prompt": "Explore the maze."}


def supo_reply(actions: list[str]):
    """Actions in order; a summary S{k+1} whenever the prompt ends with the summary request
    (k read from the segment's prompt, so any engine instance continues the numbering)."""
    count = {"action": 0}

    def reply(prompt: str, n: int, seed: int | None) -> str:
        if prompt.endswith(SUMMARY_PROMPT + "<|im_end|>\n<|im_start|>assistant\n"):
            previous = re.search(r"problem:\nS(\d+)", prompt)
            return f"<summary>S{int(previous.group(1)) + 1 if previous else 1}</summary>"
        count["action"] += 1
        return actions[min(count["action"], len(actions)) - 1]

    return reply


def check_masks(traj: Trajectory, tok: CharTokenizer, version: int) -> None:
    """Prompt/observation tokens 0, policy actions and summaries 1, with versions."""
    for seg in traj.segments:
        seg.check()
        policy = set()
        for t in seg.turns:
            policy.update(range(t.action_start, t.action_end))
        assert {i for i, m in enumerate(seg.loss_mask) if m} == policy
        assert all(seg.versions[i] == (version if i in policy else -1) for i in range(len(seg.token_ids)))
        assert not any(seg.loss_mask[: seg.prompt_len])


# ---- the pure pieces -----------------------------------------------------------------------


def test_threshold_matches_spec() -> None:
    assert summary_threshold(4096, 0.95) == 3891  # algorithms.md §4.1
    assert summary_threshold(100, 1.0) == 100


@pytest.mark.parametrize(("text", "summary"), [
    ("<summary>found the key</summary>", "found the key"),
    ("chat <summary> a </summary> more <summary>b</summary>", "b"),
    ("<think>hmm</think><summary>unclosed tail", "unclosed tail"),
    ("<think>hmm</think> plain text", "plain text"),
])
def test_extract_summary(text: str, summary: str) -> None:
    assert extract_summary(text) == summary


def test_continuation_appends_to_the_task_message() -> None:
    prompt = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    out = continuation_messages(prompt, "S")
    assert out[0] == prompt[0]
    assert out[1]["content"] == "task\n\nWe are in the following stage of solving the problem:\nS"
    assert prompt[1]["content"] == "task"  # not mutated
    with pytest.raises(ValueError, match="no user message"):
        continuation_messages(prompt[:1], "S")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"working_context": 0}, "working_context"),
    ({"ratio": 1.5}, "ratio"),
    ({"max_summaries": -1}, "max_summaries"),
    ({"max_steps": 0}, "max_steps"),
    ({"continuation_template": "no placeholder"}, "placeholder"),
])
def test_bad_parameters_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SummarizeEnv(ScriptedEnv(), **kwargs)


def test_wrapper_rejects_non_envs_and_double_wrapping() -> None:
    with pytest.raises(TypeError, match="areset"):
        SummarizeEnv(object())
    with pytest.raises(ValueError, match="once"):
        SummarizeEnv(SummarizeEnv(ScriptedEnv()))


class CounterEnv(Env):
    """A registered Env subclass: the wrapper must build it by name and delegate to it."""

    def __init__(self, turns: int = 2) -> None:
        super().__init__()
        self.turns, self.count = turns, 0

    def tasks(self, split: str = "train"):
        return [{"id": f"{split}-0", "prompt": "count"}]

    async def areset(self, task):
        self.count = 0
        return [{"role": "system", "content": "s"}, {"role": "user", "content": task["prompt"]}]

    async def astep(self, action):
        self.count += 1
        done = self.count >= self.turns
        return StepResult([] if done else [{"role": "user", "content": str(self.count)}], 0.0, done,
                          info={"outcome_reward": 1.0} if done else {})


async def test_wrapper_delegates_and_builds_by_name() -> None:
    register("rollout-test-counter", CounterEnv)
    env = make("summarize", inner_env="rollout-test-counter", inner_kwargs={"turns": 3}, working_context=64)
    assert isinstance(env, SummarizeEnv) and isinstance(env.inner, CounterEnv)
    assert env.tasks("eval") == [{"id": "eval-0", "prompt": "count"}]
    assert env.turns == 3 and env.threshold == 60  # attribute delegation
    msgs = await env.areset(env.tasks()[0])
    assert msgs[1]["content"] == "count"
    await env.astep("a")
    assert env.inner.count == 1
    # The Gymnasium facade drives the same coroutines.
    obs, info = env.reset(seed=0)
    assert obs[1]["content"] == "count" and info["task_id"] == "train-0"
    env.close()


# ---- the mechanics in the rollout engine ---------------------------------------------------


async def test_supo_trigger_drops_last_pair_and_restarts(tmp_path) -> None:
    """algorithms.md §4.5 test 3: W=4096 → L=3891; context 3880 + a 30-token pair = 3910 ≥ L, so
    the pair is removed, v_sum appended, a summary generated, and the next segment starts from
    prompt + continuation template + summary."""
    tok = CharTokenizer()
    chat = ChatTokens(tok)
    env = ScriptedEnv(turns=3)
    prompt = await env.areset(TASK)
    p = len(chat.prompt(prompt))
    gen, close, obs_overhead = 11, 1, 8  # "<|im_start|>assistant\n", "\n", "<|im_start|>tool\n…<|im_end|>\n"
    a1, a2 = "first", "a2xyz"
    first_obs = 3880 - (p + gen + len(a1) + 1 + close + obs_overhead)
    second_obs = 30 - (gen + len(a2) + 1 + close + obs_overhead)
    assert second_obs == 4
    env = ScriptedEnv(turns=3, obs_text=lambda t, a: "x" * (first_obs if t == 1 else second_obs))
    engine = ScriptedEngine(tok, reply=supo_reply([a1, a2, "final"]), version=5)
    rollout = RolloutEngine(engine, tok, SamplingParams(seed=0, max_tokens=256), max_context_tokens=8192)
    supo = SummarizeEnv(env, working_context=4096, ratio=0.95, max_summaries=7, max_steps=100)
    traj = await rollout.run_trajectory(supo, TASK, traj_id="supo")
    assert traj.status is Status.FINISHED and traj.num_summaries == 1 and not traj.overlong
    # The 30-token pair was prefilled on a 3880-token context, i.e. the trigger fired at 3910.
    assert len(engine.calls[1][0]) == 3880 + gen
    seg1, seg2 = traj.segments
    v_sum = chat.append_messages(prompt, [{"role": "user", "content": SUMMARY_PROMPT}])
    summary_start = 3880 + len(v_sum) + gen
    assert len(seg1.token_ids) == summary_start + len("<summary>S1</summary>") + 1
    assert tok.decode(seg1.token_ids[3880:summary_start]) == (
        f"<|im_start|>user\n{SUMMARY_PROMPT}<|im_end|>\n<|im_start|>assistant\n")
    assert [t.action_text for t in seg1.turns] == [a1, "<summary>S1</summary>"]  # a2's pair is gone
    assert seg1.summary == "S1" and seg2.summary is None
    expected = continuation_messages(prompt, "S1")
    assert expected[1]["content"].endswith(CONTINUATION_TEMPLATE.format(summary="S1"))
    assert seg2.token_ids[: seg2.prompt_len] == chat.prompt(expected)
    assert [t.action_text for t in seg2.turns] == ["final"]
    # The env kept the discarded action's effect: its state survives across segments.
    assert env.history == [a1, a2, "final"] and traj.step_rewards == pytest.approx([0.15, 0.2, 0.25])
    check_masks(traj, tok, version=5)


async def test_long_interaction_triggers_several_summaries() -> None:
    tok = CharTokenizer()
    engine = ScriptedEngine(tok, reply=supo_reply(["look around"]), version=2)
    env = ScriptedEnv(turns=12, obs_text=lambda t, a: f"room {t}: " + "stone wall " * 6)
    rollout = RolloutEngine(engine, tok, SamplingParams(seed=1, max_tokens=64), max_context_tokens=1024)
    traj = await rollout.run_trajectory(SummarizeEnv(env, working_context=400, ratio=0.9, max_summaries=8),
                                        TASK, traj_id="long")
    assert traj.status is Status.FINISHED and not traj.overlong
    assert traj.num_summaries >= 2 and len(traj.segments) == traj.num_summaries + 1
    for k, seg in enumerate(traj.segments):
        if k < traj.num_summaries:
            assert seg.summary == f"S{k + 1}" and seg.turns[-1].action_text == f"<summary>S{k + 1}</summary>"
        if k > 0:  # each later segment starts from s_1 + the previous summary
            want = ChatTokens(tok).prompt(continuation_messages(traj.messages[:2], f"S{k}"))
            assert seg.token_ids[: seg.prompt_len] == want
        assert len(seg.token_ids) <= 400 + 64 + len(SUMMARY_PROMPT) + 64  # W + |v_sum| + L_A
    check_masks(traj, tok, version=2)
    assert env.turn == 12 and traj.outcome_reward == 1.0
    assert traj.num_turns == env.turn  # each summary turn took the place of one discarded pair


async def test_overlong_after_max_summaries_masks_but_counts_in_group() -> None:
    """algorithms.md §4.5 test 4: S=1 and a second trigger → overlong; its reward (0) still
    enters the group's mean/std while its advantage (hence loss) is 0."""
    tok = CharTokenizer()
    engine = ScriptedEngine(tok, reply=supo_reply(["go"]))
    policy = SupoPolicy.from_config(SummarizeConfig(enabled=True, working_context=300, ratio=0.9,
                                                    max_summaries=1, max_steps=100))
    rollout = RolloutEngine(engine, tok, SamplingParams(seed=2), max_context_tokens=1024, context_policy=policy)
    group = await rollout.run_group(lambda: ScriptedEnv(turns=50, obs_text=lambda t, a: "y" * 80), TASK, 1)
    long = group.trajectories[0]
    assert long.overlong and long.status is Status.TRUNCATED and long.num_summaries == 1
    assert long.metrics["truncated_supo_max_summaries"] == 1.0 and long.outcome_reward == 0.0
    assert long.env == "scripted"  # the engine's policy applies to the plain env, unwrapped
    check_masks(long, tok, version=0)
    adv = supo_advantages(torch.tensor([long.reward, 1.0]), torch.tensor([0, 0]),
                          torch.tensor([long.overlong, False]))
    assert adv.tolist() == pytest.approx([0.0, 0.707106], abs=1e-5)  # stats over {0, 1}


async def test_step_limit_makes_rollout_overlong() -> None:
    tok = CharTokenizer()
    rollout = RolloutEngine(ScriptedEngine(tok, reply=supo_reply(["go"])), tok, SamplingParams(seed=3))
    traj = await rollout.run_trajectory(SummarizeEnv(ScriptedEnv(turns=50), max_steps=4), TASK)
    assert traj.overlong and traj.status is Status.TRUNCATED and traj.num_turns == 4
    assert traj.metrics["truncated_supo_max_steps"] == 1.0


async def test_supo_rollout_survives_export_and_resume() -> None:
    tok = CharTokenizer()

    def run_env() -> SummarizeEnv:
        return SummarizeEnv(ScriptedEnv(turns=10, obs_text=lambda t, a: "z" * 60), working_context=300,
                            ratio=0.9, max_summaries=5)

    def fresh() -> RolloutEngine:
        return RolloutEngine(ScriptedEngine(tok, reply=supo_reply(["step"])), tok, SamplingParams(seed=4))

    reference = (await fresh().run_group(run_env, TASK, 1, group_id="r")).trajectories[0]
    assert reference.num_summaries >= 2
    source = fresh()
    exports = []

    def hook(tid: str, n: int) -> None:
        if not exports and len(source.in_flight) and n > 500:  # past the first summary
            exports.append(source.request_export(tid))

    source.on_progress = hook
    assert (await source.run_group(run_env, TASK, 1, group_id="r")).trajectories == []
    state = await exports[0]
    assert state.trajectory.num_summaries >= 1 and len(state.trajectory.segments) >= 2
    moved = await fresh().resume(state)
    assert [s.token_ids for s in moved.segments] == [s.token_ids for s in reference.segments]
    assert moved.num_summaries == reference.num_summaries


def test_summarize_builds_with_no_arguments() -> None:
    """`agentrl env check summarize` and gymnasium.make("agentrl/summarize-v0") pass no
    inner_env: the wrapper then wraps the code env."""
    import gymnasium

    env = make("summarize")
    assert isinstance(env, SummarizeEnv) and env.name == "summarize(CodeEnv)" and env.threshold == 3891
    gym_env = gymnasium.make("agentrl/summarize-v0")
    assert isinstance(gym_env.unwrapped, SummarizeEnv)
    gym_env.close()
