"""Step-wise trajectories in the rollout engine: a chat template that rewrites earlier turns.

The template is a real one of that kind: Qwen3's chat template as vLLM ships it
(tests/fixtures/qwen3_chat_template.jinja, vllm/transformers_utils/chat_templates/
template_minicpmv45.jinja, verbatim). It drops the `<think>` block of every assistant turn before
the last user message, reformats the last one's, and writes an empty think block after the
generation prompt. The tokenizer here is the character one (its rendering of this template equals
Hugging Face's); test_stepwise_real.py runs the same on the embedded SmolLM2 with its tokenizer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from agentrl.envs.summarize import SUMMARY_PROMPT, SummarizeEnv
from agentrl.inference.base import SamplingParams
from agentrl.rollout import RolloutEngine, RolloutState
from agentrl.rollout.stepwise import APPEND, STEPWISE
from agentrl.trainer.batch import build_batch
from agentrl.types import Message, Segment, Status, Trajectory, Turn

from .fakes import CHATML, CharTokenizer, ScriptedEngine, ScriptedEnv, fake_logprob

QWEN3_TEMPLATE = (Path(__file__).resolve().parent.parent / "fixtures" / "qwen3_chat_template.jinja").read_text()
TASK = {"id": "t1", "prompt": "Add two numbers."}
GEN_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # the template's, thinking off


def thinking(prompt: str, n: int, seed: int | None) -> str:
    """A policy that reasons before it acts (the reasoning is what the template drops later)."""
    return f"<think>plan {seed}</think>call {seed}"  # by seed: the same on any engine (resume)


def user_env(turns: int) -> ScriptedEnv:
    """Observations are user messages (what `code` sends when a reply has no tool call): each one
    makes every earlier assistant turn "before the last user message"."""
    return ScriptedEnv(turns=turns, obs_role="user", obs_text=lambda t, a: f"result {t}")


def rollout_with(template: str, reply=thinking, **kw) -> tuple[RolloutEngine, ScriptedEngine]:
    tok = CharTokenizer(template)
    engine = ScriptedEngine(tok, reply=reply, version=kw.pop("version", 0))
    return RolloutEngine(engine, tok, SamplingParams(seed=7, max_tokens=64), **kw), engine


def requests(traj: Trajectory) -> list[tuple[Segment, Turn]]:
    return [(seg, turn) for seg in traj.segments for turn in seg.turns]


def assert_rows_hold_only_own_samples(traj: Trajectory, engine: ScriptedEngine) -> None:
    """Every policy token of every row was sampled under exactly the row's tokens before it: some
    engine call got `seg.token_ids[:action_start]` as its prompt and returned the action span with
    these log-probs. Nothing else in a row has mask 1."""
    for seg, turn in requests(traj):
        seg.check()
        prompt = seg.token_ids[:turn.action_start]
        calls = [params for p, params in engine.calls if p == prompt]
        assert calls, f"no policy request had the prompt {engine.tokenizer.decode(prompt)[-80:]!r}"
        action = seg.token_ids[turn.action_start:turn.action_end]
        reply = engine.tokenizer.decode(action)
        assert reply.removesuffix("<|im_end|>") == turn.action_text
        n = len(action)
        assert any(seg.logprobs[turn.action_start:turn.action_end] == [fake_logprob(prompt, i, p.seed) for i in range(n)]
                   for p in calls)
    for seg in traj.segments:
        policy = {i for t in seg.turns for i in range(t.action_start, t.action_end)}
        assert {i for i, m in enumerate(seg.loss_mask) if m} == policy
        assert all(seg.versions[i] == -1 and seg.logprobs[i] == 0.0 for i in range(len(seg.token_ids)) if i not in policy)


def contexts_before_requests(traj: Trajectory) -> list[list[Message]]:
    """The conversation the template rendered for each policy request (no compaction)."""
    return [traj.messages[:i] for i, m in enumerate(traj.messages) if m["role"] == "assistant"]


async def test_think_stripping_template_goes_stepwise_and_each_row_is_its_own_request() -> None:
    rollout, engine = rollout_with(QWEN3_TEMPLATE)
    assert rollout.compare_renderings  # the start-up check saw the rewrite
    traj = await rollout.run_trajectory(user_env(4), TASK, traj_id="qwen")
    assert traj.status is Status.FINISHED, traj.error
    assert traj.mode == STEPWISE and traj.to_dict()["mode"] == STEPWISE
    assert traj.metrics["stepwise_from_turn"] == 1.0  # the first observation rewrote turn 1
    # The first request continues the prompt segment; each later one is its own segment.
    assert len(traj.segments) == 4 and [len(s.turns) for s in traj.segments] == [1, 1, 1, 1]
    assert_rows_hold_only_own_samples(traj, engine)
    chat = rollout.chat
    for k, (seg, context) in enumerate(zip(traj.segments, contexts_before_requests(traj))):
        prompt = seg.token_ids[:seg.turns[0].action_start]
        assert prompt == chat.rendered(context, generation_prompt=True)  # the template's, whole
        if k:
            assert seg.prompt_len == len(prompt) and len(seg.token_ids) == seg.turns[0].action_end
            text = chat.decode(prompt)
            previous_answer = traj.messages[2 * k]["content"].split("</think>")[1]
            assert text.endswith(GEN_PROMPT) and f"assistant\n{previous_answer}<|im_end|>" in text
            assert "plan" not in text  # earlier reasoning is gone from what the policy saw
    assert len(engine.calls) == 4 and traj.num_turns == 4 and traj.step_rewards == pytest.approx([0.15, 0.2, 0.25, 0.3])


async def test_without_a_rewrite_nothing_changes() -> None:
    """An append-only template: one segment, mode append, and the same tokens whether the engine
    trusts the template's deltas (its start-up check passed) or compares whole renderings."""
    trusted, _ = rollout_with(CHATML)
    assert not trusted.compare_renderings
    a = (await trusted.run_group(lambda: user_env(3), TASK, 2, group_id="g")).trajectories
    comparing, engine = rollout_with(CHATML)
    comparing.compare_renderings = True
    b = (await comparing.run_group(lambda: user_env(3), TASK, 2, group_id="g")).trajectories
    for x, y in zip(a, b):
        assert x.mode == y.mode == APPEND and len(x.segments) == len(y.segments) == 1 and "stepwise_from_turn" not in x.metrics
        assert (x.segments[0].token_ids, x.segments[0].loss_mask, x.segments[0].logprobs) == \
               (y.segments[0].token_ids, y.segments[0].loss_mask, y.segments[0].logprobs)
        assert x.messages == y.messages
    assert_rows_hold_only_own_samples(b[0], engine)
    # The rewriting template on a one-turn episode: nothing was rewritten, so it stays append.
    rollout, _ = rollout_with(QWEN3_TEMPLATE)
    one = await rollout.run_trajectory(ScriptedEnv(turns=1), TASK)
    assert one.mode == APPEND and len(one.segments) == 1 and one.status is Status.FINISHED


async def test_a_rewrite_the_start_up_check_missed_is_caught_by_the_deltas() -> None:
    """Without the start-up check the engine takes the template's deltas; the first delta that
    is not an extension of the rendering before it switches the trajectory to step-wise."""
    rollout, engine = rollout_with(QWEN3_TEMPLATE, verify_template=False)
    assert not rollout.compare_renderings
    traj = await rollout.run_trajectory(user_env(3), TASK)
    assert traj.status is Status.FINISHED and traj.mode == STEPWISE and len(traj.segments) == 3
    assert_rows_hold_only_own_samples(traj, engine)
    for seg, context in list(zip(traj.segments, contexts_before_requests(traj)))[1:]:
        assert seg.token_ids[:seg.prompt_len] == rollout.chat.rendered(context, generation_prompt=True)


def summarizing_reply(prompt: str, n: int, seed: int | None) -> str:
    if prompt.endswith(SUMMARY_PROMPT + "<|im_end|>\n" + GEN_PROMPT):
        previous = re.findall(r"<summary>S(\d+)", prompt)
        return f"<summary>S{len(previous) + n}</summary>"
    return thinking(prompt, n, seed)


async def test_supo_summaries_in_a_stepwise_trajectory() -> None:
    rollout, engine = rollout_with(QWEN3_TEMPLATE, reply=summarizing_reply, version=4, max_context_tokens=2048)
    inner = ScriptedEnv(turns=9, obs_role="user", obs_text=lambda t, a: f"room {t}: " + "stone wall " * 8)
    traj = await rollout.run_trajectory(SummarizeEnv(inner, working_context=500, ratio=0.9, max_summaries=8),
                                        TASK, traj_id="supo")
    assert traj.status is Status.FINISHED and not traj.overlong, traj.error
    assert traj.mode == STEPWISE and traj.num_summaries >= 2 and inner.turn == 9
    assert_rows_hold_only_own_samples(traj, engine)
    assert traj.version == 4
    summaries = [k for k, s in enumerate(traj.segments) if s.summary is not None]
    assert len(summaries) == traj.num_summaries
    for k in summaries:
        seg = traj.segments[k]
        assert seg.turns[-1].action_text == f"<summary>{seg.summary}</summary>"
        assert rollout.chat.decode(seg.token_ids[:seg.prompt_len]).endswith(SUMMARY_PROMPT + "<|im_end|>\n" + GEN_PROMPT)
        # The next request starts from s_1 and this summary, not from the dropped history.
        after = rollout.chat.decode(traj.segments[k + 1].token_ids[:traj.segments[k + 1].prompt_len])
        assert seg.summary in after and "room 1:" not in after
    assert all(len(s.token_ids) <= 500 + 64 + len(SUMMARY_PROMPT) + 64 for s in traj.segments)  # W + |v_sum| + L_A


async def test_stepwise_trajectory_survives_export_and_resume() -> None:
    reference_rollout, _ = rollout_with(QWEN3_TEMPLATE)
    reference = (await reference_rollout.run_group(lambda: user_env(4), TASK, 1,
                                                   group_id="mv")).trajectories[0]
    rollout, _ = rollout_with(QWEN3_TEMPLATE)
    exports = []

    def hook(tid: str, n: int) -> None:
        hook.calls += 1
        if hook.calls == 4:  # turn 2's action and observation are in: already step-wise
            exports.append(rollout.request_export(tid))

    hook.calls = 0
    rollout.on_progress = hook
    assert (await rollout.run_group(lambda: user_env(4), TASK, 1, group_id="mv")).trajectories == []
    state = await exports[0]
    assert state.turn == 2 and state.trajectory.mode == STEPWISE
    moved_state = RolloutState.from_dict(json.loads(json.dumps(state.to_dict())))  # across processes
    other, engine = rollout_with(QWEN3_TEMPLATE)
    moved = await other.resume(moved_state, env_factory=lambda: user_env(4))
    assert moved.status is Status.FINISHED and moved.mode == STEPWISE
    assert [(s.token_ids, s.loss_mask, s.logprobs, s.prompt_len) for s in moved.segments] == \
           [(s.token_ids, s.loss_mask, s.logprobs, s.prompt_len) for s in reference.segments]
    assert moved.messages == reference.messages and moved.step_rewards == reference.step_rewards
    assert len(engine.calls) == 2  # only turns 3 and 4 ran here


async def test_every_row_of_a_stepwise_trajectory_gets_its_advantage() -> None:
    rollout, _ = rollout_with(QWEN3_TEMPLATE)
    group = await rollout.run_group(lambda: user_env(3), TASK, 2)
    trajs = group.trajectories
    assert [t.mode for t in trajs] == [STEPWISE, STEPWISE]
    batch = build_batch(trajs, torch.tensor([0.75, -0.5]), torch.tensor([0, 0]))
    assert len(batch) == sum(len(t.segments) for t in trajs) == 6
    assert batch.traj_index.tolist() == [0, 0, 0, 1, 1, 1]
    row = 0
    for traj, adv in zip(trajs, [0.75, -0.5]):
        for seg in traj.segments:
            n = len(seg.token_ids)
            assert batch.input_ids[row, :n].tolist() == seg.token_ids
            assert batch.loss_mask[row, :n].tolist() == seg.loss_mask and batch.loss_mask[row, n:].sum() == 0
            mask = batch.loss_mask[row].bool()
            assert torch.all(batch.advantages[row][mask] == adv) and torch.all(batch.advantages[row][~mask] == 0)
            assert batch.behaviour_logprobs[row, :n].tolist() == pytest.approx(seg.logprobs)
            row += 1


async def test_laminar_single_version_rule_spans_every_stepwise_row() -> None:
    """Laminar's buffer takes a trajectory only at one weight version (`Trajectory.version`): a
    push between two step-wise requests is flagged like one inside an append segment."""
    rollout, engine = rollout_with(QWEN3_TEMPLATE, version=1)

    async def push(tid: str, n: int) -> None:
        if rollout.snapshot(tid).mode == STEPWISE:
            engine.version = 2  # weights swapped after the rewrite, under a running trajectory

    rollout.on_progress = push
    traj = await rollout.run_trajectory(user_env(3), TASK)
    assert traj.mode == STEPWISE and [set(s.versions) - {-1} for s in traj.segments] == [{1}, {2}, {2}]
    assert traj.metrics["version_switches"] == 2.0  # each request after the push
    with pytest.raises(ValueError, match="mixes weight versions"):
        _ = traj.version
