"""Context management through the ContextPolicy interface: a policy that is not SUPO (a sliding
window that generates nothing) drives the same engine mechanics; an env's own policy wins."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from agentrl.envs.summarize import SummarizeEnv, SupoPolicy
from agentrl.inference.base import SamplingParams
from agentrl.rollout import ContextPolicy, RolloutEngine, context_policy_of
from agentrl.rollout.tokens import ChatTokens
from agentrl.types import Message, Status

from .fakes import CharTokenizer, ScriptedEngine, ScriptedEnv

TASK = {"id": "window", "prompt": "Walk the corridor."}


@dataclass(frozen=True)
class LastObservation:
    """Past `threshold` tokens, restart from the initial prompt plus the last observation; no
    generation, the pair that crossed the threshold stays."""

    threshold: int = 200
    working_context: int = 4096
    max_compactions: int = 100
    max_steps: int = 100
    drop_last_pair: bool = False

    def compaction_request(self) -> Message | None:
        return None

    def extract(self, text: str) -> str:
        return text

    def next_context(self, initial: Sequence[Message], context: Sequence[Message],
                     extracted: str | None) -> list[Message]:
        assert extracted is None
        return [*initial, Message(role="user", content=f"Last seen: {context[-1]['content']}")]


def test_supo_policy_implements_the_protocol() -> None:
    assert isinstance(SupoPolicy(), ContextPolicy) and isinstance(LastObservation(), ContextPolicy)
    env = SummarizeEnv(ScriptedEnv(), working_context=300, ratio=0.5)
    assert context_policy_of(env) is env.context_policy and env.threshold == 150
    assert context_policy_of(ScriptedEnv()) is None
    assert context_policy_of(ScriptedEnv(), LastObservation()) == LastObservation()


async def test_a_window_policy_restarts_segments_without_generating() -> None:
    tok = CharTokenizer()
    engine = ScriptedEngine(tok, reply=lambda prompt, n, seed: "step")
    rollout = RolloutEngine(engine, tok, SamplingParams(seed=0), max_context_tokens=1024,
                            context_policy=LastObservation())
    env = ScriptedEnv(turns=8, obs_text=lambda t, a: f"room {t} " + "." * 60)
    traj = await rollout.run_trajectory(env, TASK)
    assert traj.status is Status.FINISHED and traj.num_summaries >= 2
    assert len(engine.calls) == 8  # one generation per action, none for compactions
    assert traj.num_turns == 8  # no pair dropped
    chat = ChatTokens(tok)
    for k, seg in enumerate(traj.segments[1:], 1):
        last = traj.segments[k - 1].turns[-1].observation[-1]["content"]
        want = [*traj.messages[:2], {"role": "user", "content": f"Last seen: {last}"}]
        assert seg.token_ids[: seg.prompt_len] == chat.prompt(want)
        assert seg.summary is None


async def test_the_envs_own_policy_wins_over_the_engines() -> None:
    tok = CharTokenizer()
    engine = ScriptedEngine(tok, reply=lambda prompt, n, seed: "<summary>S</summary>")
    rollout = RolloutEngine(engine, tok, SamplingParams(seed=0), context_policy=LastObservation(threshold=10**6))
    env = SummarizeEnv(ScriptedEnv(turns=6, obs_text=lambda t, a: "x" * 80), working_context=300, ratio=0.8)
    traj = await rollout.run_trajectory(env, TASK)
    assert traj.num_summaries >= 1 and traj.segments[0].summary == "S"


def test_a_broken_env_policy_is_named() -> None:
    class Broken(ScriptedEnv):
        context_policy = "truncate"

    with pytest.raises(TypeError, match=r"Broken\.context_policy must implement"):
        context_policy_of(Broken())
