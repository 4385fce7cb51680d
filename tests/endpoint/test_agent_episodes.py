"""Agent episodes inside the rollout engine on the real hf engine (embedded SmolLM2-135M): token-exact
trajectories for an append-only template and for Qwen3's think-stripping one, and each way a
program can go wrong ending its own episode only (issue 54)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import openai
import torch

from agentrl import AgentEnv, Env, EnvAgent, ToolEnv, tool
from agentrl.inference.base import SamplingParams
from agentrl.rollout import RolloutEngine
from agentrl.rollout.stepwise import APPEND, STEPWISE
from agentrl.rollout.tokens import ChatTokens
from agentrl.trainer.logprobs import token_logprobs
from agentrl.types import Status, StepResult, Trajectory

# Qwen3's chat template (vLLM's copy, verbatim), shared with tests/rollout/test_stepwise_engine.py: it
# drops the <think> block of every assistant turn before the last user message.
QWEN3_TEMPLATE = (Path(__file__).resolve().parent.parent / "fixtures" / "qwen3_chat_template.jinja").read_text()
TASK = {"id": "t1", "a": 2, "b": 3}


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@tool(terminal=True)
def submit(answer: str) -> str:
    """Submit the final answer."""
    return answer


class AddEnv(ToolEnv):
    tools = (add, submit)
    max_turns = 3

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        return [TASK]

    def user_prompt(self, task: dict[str, Any]) -> str:
        return f"What is {task['a']} + {task['b']}? Use add, then submit."

    async def reward(self, task: dict[str, Any], state: Any) -> float:
        return 0.25


class NudgeEnv(Env):
    """Every reply gets a user message back: each makes the earlier assistant turns "before the last
    user message", whose <think> blocks Qwen3's template drops."""

    async def areset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        self.turn = 0
        return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to three."}]

    async def astep(self, action: str) -> StepResult:
        self.turn += 1
        done = self.turn >= 3
        return StepResult([] if done else [{"role": "user", "content": f"Go on ({self.turn})."}], terminated=done,
                          info={"outcome_reward": 0.5} if done else {})

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        return [TASK]


def same_rows(a: Trajectory, b: Trajectory) -> None:
    assert len(a.segments) == len(b.segments)
    for x, y in zip(a.segments, b.segments):
        assert x.token_ids == y.token_ids and x.loss_mask == y.loss_mask and x.versions == y.versions
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)
        assert x.prompt_len == y.prompt_len
        # (a turn's observation span: the engine's stops before the next generation prompt)
        assert [(t.action_start, t.action_end, t.action_text) for t in x.turns] == \
            [(t.action_start, t.action_end, t.action_text) for t in y.turns]


async def test_an_append_only_template_gives_the_trajectory_the_rollout_engine_builds(hf_engine) -> None:
    rollout = RolloutEngine(hf_engine, hf_engine.tokenizer, SamplingParams(seed=11, max_tokens=24))
    native = await rollout.run_trajectory(AddEnv(), TASK, traj_id="same")  # same id: same sampling seeds
    agent = EnvAgent(AddEnv)
    through_endpoint = await rollout.run_trajectory(agent, TASK, traj_id="same")
    assert native.status.trainable and through_endpoint.status is Status.FINISHED, through_endpoint.error
    assert len(agent.requests) == native.num_turns >= 2
    assert through_endpoint.mode == native.mode == APPEND
    same_rows(native, through_endpoint)
    assert through_endpoint.reward == native.reward
    seen = [{k: m[k] for k in ("role", "content")} for m in native.messages]  # the last observation: no request
    assert through_endpoint.messages == seen[: len(through_endpoint.messages)] and len(seen) - len(agent.requests[-1]) <= 2


async def test_a_think_stripping_template_trains_each_request_as_its_own_exact_row(hf_engine) -> None:
    tokenizer = type(hf_engine.tokenizer).from_pretrained(hf_engine.tokenizer.name_or_path)
    tokenizer.chat_template = QWEN3_TEMPLATE
    rollout = RolloutEngine(hf_engine, tokenizer, SamplingParams(seed=5, max_tokens=16), verify_template=False)
    native = await rollout.run_trajectory(NudgeEnv(), TASK, traj_id="think")  # the engine's own step-wise rows
    agent = EnvAgent(NudgeEnv)
    traj = await rollout.run_trajectory(agent, TASK, traj_id="think")
    assert traj.status is Status.FINISHED and traj.reward == 0.5, traj.error
    assert traj.mode == native.mode == STEPWISE and len(traj.segments) == len(agent.requests) == 3
    for ours, engines in zip(traj.segments, native.segments, strict=True):
        assert ours.token_ids == engines.token_ids and ours.loss_mask == engines.loss_mask
        assert torch.allclose(torch.tensor(ours.logprobs), torch.tensor(engines.logprobs), atol=1e-5)
    chat = ChatTokens(tokenizer)
    for k, (seg, context) in enumerate(zip(traj.segments, agent.requests)):
        seg.check()
        prompt = seg.token_ids[: seg.prompt_len]
        # the engine's prompt for this request: the first opens a context, the later ones are the
        # template's whole rendering (what it step-wise trains, rollout/engine.py)
        expected = chat.prompt(context) + chat.generation_prompt(context) if k == 0 else \
            chat.encode(chat.render(context, generation_prompt=True))
        assert prompt == expected
        assert seg.loss_mask == [0] * seg.prompt_len + [1] * (len(seg.token_ids) - seg.prompt_len)
        with torch.no_grad():
            learner = token_logprobs(hf_engine.model, torch.tensor([seg.token_ids]))[0]
        mask = torch.tensor(seg.loss_mask, dtype=torch.bool)
        assert float((learner[mask] - torch.tensor(seg.logprobs)[mask]).abs().max()) < 1e-3


class Raises(AgentEnv):
    async def run(self, task: dict[str, Any], client: Any) -> float:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        raise ValueError("the agent's own bug")


class NeverCalls(AgentEnv):
    async def run(self, task: dict[str, Any], client: Any) -> float:
        return 1.0


class OverBudget(AgentEnv):
    """Still waiting for a long generation when the episode's wall-clock budget runs out."""

    port: int = 0

    async def run(self, task: dict[str, Any], client: Any) -> float:
        OverBudget.port = client.base_url.port
        assert client.base_url.host == "127.0.0.1"
        await client.completions.create(model="policy", prompt="1, 2, 3, 4, 5, 6, 7,", max_tokens=2000)
        await asyncio.sleep(60)
        return 1.0


class TooManyRequests(AgentEnv):
    max_requests = 2

    async def run(self, task: dict[str, Any], client: Any) -> float:
        while True:  # the third request is refused (429) and the program gives up
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "more"}])


async def test_each_bad_program_ends_its_own_episode_and_nothing_is_left_listening(hf_engine) -> None:
    rollout = RolloutEngine(hf_engine, hf_engine.tokenizer, SamplingParams(seed=2, max_tokens=8), concurrency=4)
    good = EnvAgent(NudgeEnv)
    runs = [rollout.run_trajectory(env, TASK, traj_id=name) for name, env in
            [("raises", Raises()), ("silent", NeverCalls()), ("requests", TooManyRequests()), ("good", good)]]
    raised, silent, requests, fine = await asyncio.gather(*runs)
    assert raised.status is Status.ERROR and "ValueError: the agent's own bug" in raised.error
    assert "Traceback" in raised.error and "in run" in raised.error and raised.num_policy_tokens > 0
    assert silent.status is Status.ERROR and silent.metrics["agent_dropped"] == 1.0 and "dropped" in silent.error
    assert requests.status is Status.TRUNCATED and requests.metrics.get("truncated_requests") == 1.0
    assert len(requests.segments) == 2  # the two requests it was allowed, step-wise rows of one prompt
    assert fine.status is Status.FINISHED and fine.reward == 0.5
    assert rollout._agents.endpoint is None  # the last episode stopped it


async def test_a_program_over_its_budget_is_cancelled_with_its_open_request(hf_engine) -> None:
    rollout = RolloutEngine(hf_engine, hf_engine.tokenizer, SamplingParams(seed=2, max_tokens=2000),
                            trajectory_timeout_s=3)
    over = await rollout.run_trajectory(OverBudget(), TASK)
    assert over.status is Status.ABORTED and "wall-clock budget" in over.error
    for _ in range(200):  # the engine drops the aborted row at its next step
        if hf_engine._batch is None:
            break
        await asyncio.sleep(0.01)
    assert hf_engine._batch is None
    assert rollout._agents.endpoint is None
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", OverBudget.port)) != 0  # nothing left listening


async def test_a_program_that_catches_the_refusal_finishes_with_its_reward(hf_engine) -> None:
    class Careful(AgentEnv):
        max_requests = 1

        async def run(self, task: dict[str, Any], client: Any) -> float:
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a"}])
            try:
                await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "b"}])
            except openai.RateLimitError as e:
                assert "budget of 1 model requests" in e.message
            return 0.75

    rollout = RolloutEngine(hf_engine, hf_engine.tokenizer, SamplingParams(seed=2, max_tokens=4))
    traj = await rollout.run_trajectory(Careful(), TASK)
    assert traj.status is Status.FINISHED and traj.reward == 0.75 and traj.num_turns == 1
