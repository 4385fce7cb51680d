"""The rollout engine against the real components: the embedded SmolLM2-135M model in the hf
engine, its real chat template, the trainer's forward pass and real bubblewrap sandboxes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from agentrl.env import Env, EnvError
from agentrl.envs.summarize import SummarizeEnv, continuation_messages
from agentrl.inference.base import SamplingParams
from agentrl.rollout import RolloutEngine
from agentrl.rollout.tokens import ChatTokens
from agentrl.types import Status, StepResult, Trajectory

from .fakes import ScriptedEnv

TASK = {"id": "count", "prompt": "Count the characters of your reply with the wc tool, then say done."}


class SandboxWcEnv(Env):
    """Every action is piped into `wc -c` inside a real bubblewrap sandbox; the output comes back
    as a tool message. A sandbox that dies makes the env fail (EnvError)."""

    name = "sandbox-wc"

    def __init__(self, turns: int = 2, delay_s: float = 0.0, kill_after_s: float | None = None) -> None:
        super().__init__()
        from agentrl.sandboxes.local import LocalSandbox

        self.sandbox = LocalSandbox()
        self.turns, self.delay_s, self.kill_after_s = turns, delay_s, kill_after_s
        self.history: list[str] = []

    async def areset(self, task):
        self.history = []
        return [{"role": "system", "content": "You are a helpful assistant with a wc tool."},
                {"role": "user", "content": task["prompt"]}]

    async def astep(self, action: str) -> StepResult:
        self.history.append(action)
        if self.kill_after_s is not None:  # the fault: the sandbox dies while the tool runs
            asyncio.get_running_loop().call_later(self.kill_after_s,
                                                  lambda: asyncio.ensure_future(self.sandbox.close()))
        result = await self.sandbox.exec(f"sleep {self.delay_s}; wc -c", stdin=action, timeout=20)
        if not result.ok:
            raise EnvError(f"sandbox exec failed with exit code {result.exit_code}")
        done = len(self.history) >= self.turns
        info = {"step_rewards": {"tool_ok": 0.1}, "num_tool_calls": 1}
        if done:
            info.update(outcome_reward=1.0, reward_components={"done": 1.0})
        obs = [] if done else [{"role": "tool", "content": result.stdout.strip()}]
        return StepResult(obs, 0.1, terminated=done, info=info)

    async def aclose(self):
        await self.sandbox.close()


@pytest.fixture
async def hf_engine(smollm2_path: Path):
    from agentrl.inference.hf import HFEngine

    engine = HFEngine(smollm2_path, max_batch_size=8)
    yield engine
    await engine.close()


def rendered_matches_tokens(traj: Trajectory, chat: ChatTokens) -> None:
    """The segment's tokens decode to the template's rendering of the transcript."""
    seg = traj.segments[0]
    last = seg.turns[-1]
    tail = "\n" if chat.ends_turn(seg.token_ids[last.action_start:last.action_end]) else "<|im_end|>\n"
    assert chat.decode(seg.token_ids) + tail == chat.render(traj.messages)


def max_logprob_diff(model: torch.nn.Module, traj: Trajectory) -> float:
    from agentrl.trainer.logprobs import token_logprobs

    worst = 0.0
    for seg in traj.segments:
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([seg.token_ids]))[0]
        mask = torch.tensor(seg.loss_mask, dtype=torch.bool)
        worst = max(worst, float((lp[mask] - torch.tensor(seg.logprobs)[mask]).abs().max()))
    return worst


async def test_trainer_forward_reproduces_behaviour_logprobs(hf_engine) -> None:
    rollout = RolloutEngine(hf_engine, hf_engine.tokenizer, SamplingParams(seed=11, max_tokens=16))
    env = SandboxWcEnv(turns=3)
    traj = await rollout.run_trajectory(env, TASK, traj_id="lp")
    assert traj.status is Status.FINISHED, traj.error
    assert traj.num_turns == 3 and [m["role"] for m in traj.messages][3::2] == ["tool", "tool"]
    assert traj.messages[3]["content"] == str(len(traj.messages[2]["content"].encode()))  # real wc output
    seg = traj.segments[0]
    seg.check()
    assert traj.version == 0 and set(seg.versions) == {-1, 0}
    rendered_matches_tokens(traj, rollout.chat)
    diff = max_logprob_diff(hf_engine.model, traj)
    assert diff < 1e-4, f"trainer vs behaviour log-prob max abs diff {diff}"
    assert traj.step_rewards == pytest.approx([0.1, 0.1, 0.1]) and traj.outcome_reward == 1.0


async def test_turn_k_plus_one_does_not_recompute_turn_k(hf_engine) -> None:
    """Through the rollout engine: each turn's prompt starts with the previous turn's prompt and
    completion, and the hf engine prefills only what was appended since (its metrics count it)."""
    rollout = RolloutEngine(hf_engine, hf_engine.tokenizer, SamplingParams(seed=7, max_tokens=8))
    traj = await rollout.run_trajectory(ScriptedEnv(turns=3), TASK, traj_id="kv")
    assert traj.status is Status.FINISHED, traj.error
    turns = traj.segments[0].turns
    kept = [t.action_end - 1 for t in turns[:-1]]  # all but each turn's last sampled token
    new = [turns[0].action_start] + [t.action_start - k for t, k in zip(turns[1:], kept)]
    assert hf_engine.metrics["prefix_hit_tokens"] == sum(kept)
    assert hf_engine.metrics["prefill_tokens"] == sum(new) < turns[-1].action_start
    assert max_logprob_diff(hf_engine.model, traj) < 1e-4


async def test_killed_sandbox_fails_one_trajectory_of_eight(hf_engine) -> None:
    envs: list[SandboxWcEnv] = []

    def factory() -> SandboxWcEnv:
        envs.append(SandboxWcEnv(turns=2, delay_s=0.5, kill_after_s=0.15 if len(envs) == 3 else None))
        return envs[-1]

    rollout = RolloutEngine(hf_engine, hf_engine.tokenizer, SamplingParams(seed=5, max_tokens=8), concurrency=8)
    group = await rollout.run_group(factory, TASK, 8, group_id="kill")
    assert len(group.trajectories) == 8
    failed = [t for t in group.trajectories if t.status is Status.ERROR]
    # Killed during its exec (SIGKILL, 137) or, on a slow host, just before it (closed).
    assert len(failed) == 1 and any(why in failed[0].error for why in ("exit code 137", "sandbox is closed", "sandbox agent is gone"))
    killed_env = envs[3]
    assert failed[0].messages[2]["content"] == killed_env.history[0]  # it is the killed one
    for traj in group.trajectories:
        if traj is failed[0]:
            continue
        assert traj.status is Status.FINISHED and traj.num_turns == 2 and traj.outcome_reward == 1.0
        traj.segments[0].check()
        rendered_matches_tokens(traj, rollout.chat)
        # The observation is the real tool output for this trajectory's own action.
        assert traj.messages[3]["content"] == str(len(traj.messages[2]["content"].encode()))
    assert all(e.sandbox._closed for e in envs)


async def test_export_after_turn_one_resumes_on_second_engine(hf_engine, smollm2_path: Path) -> None:
    from agentrl.inference.hf import HFEngine

    sampling = SamplingParams(seed=21, max_tokens=10)
    rollout = RolloutEngine(hf_engine, hf_engine.tokenizer, sampling)
    reference = (await rollout.run_group(lambda: ScriptedEnv(turns=3), TASK, 1, group_id="mv")).trajectories[0]

    exports = []

    def hook(tid: str, n: int) -> None:
        hook.calls += 1
        if hook.calls == 2:  # turn 1's action and observation are in
            exports.append(rollout.request_export(tid))

    hook.calls = 0
    rollout.on_progress = hook
    assert (await rollout.run_group(lambda: ScriptedEnv(turns=3), TASK, 1, group_id="mv")).trajectories == []
    state = await exports[0]
    assert state.turn == 1

    other_engine = HFEngine(smollm2_path, max_batch_size=8)  # same weights, another object
    try:
        moved = await RolloutEngine(other_engine, other_engine.tokenizer, sampling).resume(state)
    finally:
        await other_engine.close()
    assert moved.status is Status.FINISHED and reference.status is Status.FINISHED
    a, b = moved.segments[0], reference.segments[0]
    assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask and a.versions == b.versions
    # fp32 noise only: the reference reused turn 1's kept KV, the second engine recomputed it.
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert moved.step_rewards == reference.step_rewards and moved.outcome_reward == reference.outcome_reward


@pytest.mark.slow
async def test_supo_with_real_model_summarises_twice(hf_engine) -> None:
    rollout = RolloutEngine(hf_engine, hf_engine.tokenizer, SamplingParams(seed=3, max_tokens=16),
                            max_context_tokens=512)
    inner = ScriptedEnv(turns=7, obs_text=lambda t, a: f"Room {t}. " + "The walls are grey stone. " * 8)
    env = SummarizeEnv(inner, working_context=220, ratio=0.8, max_summaries=5)
    traj = await rollout.run_trajectory(env, TASK, traj_id="supo")
    assert traj.status is Status.FINISHED and not traj.overlong, traj.error
    assert traj.num_summaries >= 2 and len(traj.segments) == traj.num_summaries + 1
    chat = rollout.chat
    for k, seg in enumerate(traj.segments):
        seg.check()
        policy = {i for t in seg.turns for i in range(t.action_start, t.action_end)}
        assert {i for i, m in enumerate(seg.loss_mask) if m} == policy
        assert {seg.versions[i] for i in policy} == {0}
        if k > 0:
            prev = traj.segments[k - 1].summary
            assert seg.token_ids[:seg.prompt_len] == chat.prompt(continuation_messages(traj.messages[:2], prev))
    assert inner.turn == 7  # the env's state ran on across segments
    assert max_logprob_diff(hf_engine.model, traj) < 1e-3  # every segment, summaries included
