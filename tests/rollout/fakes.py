"""Test doubles for rollout logic tests: a character-level ChatML tokenizer (exact, countable
token lengths), a deterministic scripted inference engine and a scripted env.

Every feature tested with these is also tested against the real model, template and sandboxes
in test_real_model.py."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import jinja2

from agentrl.inference.base import GenerateOutput, SamplingParams
from agentrl.types import Message, StepResult, Task

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = {"<|im_start|>": 1, "<|im_end|>": 2}


class CharTokenizer:
    """One token per character (id = ord + 10), plus <|im_start|>=1 and <|im_end|>=2 (EOS)."""

    eos_token_id = 2

    def __init__(self, template: str = CHATML) -> None:
        self.chat_template = template
        self._compiled = jinja2.Environment().from_string(template)

    def apply_chat_template(self, conversation: Sequence[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False, **_: Any) -> str:
        assert not tokenize
        return self._compiled.render(messages=list(conversation),
                                                          add_generation_prompt=add_generation_prompt)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for tok, tid in SPECIALS.items():
                if text.startswith(tok, i):
                    ids.append(tid)
                    i += len(tok)
                    break
            else:
                ids.append(ord(text[i]) + 10)
                i += 1
        return ids

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        inv = {v: k for k, v in SPECIALS.items()}
        return "".join(inv.get(i, chr(i - 10) if i >= 10 else "") for i in ids)


def fake_logprob(prompt_ids: Sequence[int], i: int, seed: int | None) -> float:
    """A deterministic 'behaviour log-prob' that depends on the context, position and seed."""
    h = hashlib.sha256(f"{len(prompt_ids)}:{sum(prompt_ids)}:{i}:{seed}".encode()).digest()
    return -int.from_bytes(h[:4], "little") / 2**32 * 5.0


class ScriptedEngine:
    """Replies with `reply(prompt_text, call_index, seed)` (default: a fixed action), encoded by
    the tokenizer and ended with EOS unless max_tokens cuts it. `delay(...)` seconds per call."""

    def __init__(self, tokenizer: Any, reply: Callable[[str, int, int | None], str] | None = None,
                 delay: Callable[[int], float] | float = 0.0, version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.reply = reply or (lambda prompt, n, seed: f"action {seed}")
        self.delay = delay
        self.version = version
        self.calls: list[tuple[list[int], SamplingParams]] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        n = len(self.calls)
        self.calls.append((list(prompt_ids), sampling))
        d = self.delay(n) if callable(self.delay) else self.delay
        if d:
            await asyncio.sleep(d)
        text = self.reply(self.tokenizer.decode(prompt_ids), n, sampling.seed)
        ids = [*self.tokenizer.encode(text), self.tokenizer.eos_token_id]
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        lps = [fake_logprob(prompt_ids, i, sampling.seed) for i in range(len(ids))]
        return GenerateOutput(ids, lps, finish, self.version)

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.version = version

    async def close(self) -> None:
        pass


class ScriptedEnv:
    """Observations are tool messages `obs_text(turn, action)`; it terminates after `turns`
    steps with outcome reward `outcome`. `fail_at` raises on that turn; `step_delay` sleeps."""

    name = "scripted"

    def __init__(self, turns: int = 3, obs_text: Callable[[int, str], str] | None = None,
                 outcome: float = 1.0, fail_at: int | None = None, step_delay: float = 0.0,
                 obs_role: str = "tool") -> None:
        self.turns = turns
        self.obs_text = obs_text or (lambda t, a: f"result {t} for {a!r}")
        self.outcome = outcome
        self.fail_at = fail_at
        self.step_delay = step_delay
        self.obs_role = obs_role
        self.turn = 0
        self.history: list[str] = []  # the env's state: survives SUPO segments
        self.closed = False

    async def areset(self, task: Task) -> list[Message]:
        self.turn = 0
        self.history = []
        return [{"role": "system", "content": "You are a test agent."},
                {"role": "user", "content": task.get("prompt", "Solve it.")}]

    async def astep(self, action: str) -> StepResult:
        if self.step_delay:
            await asyncio.sleep(self.step_delay)
        self.turn += 1
        self.history.append(action)
        if self.fail_at is not None and self.turn >= self.fail_at:
            raise RuntimeError(f"env broke at turn {self.turn}")
        done = self.turn >= self.turns
        info: dict[str, Any] = {"step_rewards": {"valid": 0.1, "format": 0.05 * self.turn}}
        if done:
            info.update(outcome_reward=self.outcome, reward_components={"tests": self.outcome})
        obs = [] if done else [{"role": self.obs_role, "content": self.obs_text(self.turn, action)}]
        return StepResult(obs, 0.1 + 0.05 * self.turn, terminated=done, info=info)

    async def aclose(self) -> None:
        self.closed = True
