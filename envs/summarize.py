"""The summarize context manager: SUPO around any env (algorithms.md §4).

`SupoPolicy` is SUPO as an `agentrl.rollout.ContextPolicy`: after each (action, observation)
pair, if the working context reached L = ⌊ratio·W⌋ tokens, the pair is dropped from the token
context (the env keeps its effects), the summary prompt v_sum is sent as a user turn, the policy
writes the summary (trained tokens), and the next segment starts from the initial prompt plus
the continuation template holding the summary. At most S summaries and H steps (actions plus
summaries); past either the rollout is overlong. The token mechanics live in the rollout engine.

`SummarizeEnv(inner)` behaves exactly like `inner` (reset, step, close, tasks, state all
delegate) and hands the rollout engine its `SupoPolicy` as `context_policy`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from agentrl.env import Env, call_demonstrate, make
from agentrl.types import Message, StepResult, Task

# v_sum, SUPO App. B.2 (CodeGym variant), sent as a user turn (algorithms.md §4.1).
SUMMARY_PROMPT = (
    "You are a helpful agent interacting with a function calling environment to solve user's problem.\n"
    "The interaction history is now too long. Please summarize the interaction history.\n"
    "- Remember to keep the important information in the history to ensure that you can continue "
    "solving the problem.\n"
    "- Do not call any function in this turn.\n"
    "Now generate the summary, and put your summary inside tag <summary></summary>."
)
# SUPO App. C.1.1: s_{k+1} = s_1 ⊕ this ⊕ summary_k.
CONTINUATION_TEMPLATE = "\n\nWe are in the following stage of solving the problem:\n{summary}"

_SUMMARY_TAG = re.compile(r"<summary>(.*?)(?:</summary>|$)", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def summary_threshold(working_context: int, ratio: float) -> int:
    """L = ⌊ratio · W⌋ (SUPO, algorithms.md §4.1): W=4096, ratio=0.95 gives 3891."""
    return math.floor(ratio * working_context)


def extract_summary(text: str) -> str:
    """The text inside the last `<summary>…</summary>` (an unclosed tag runs to the end).

    A reply without the tag is used whole, minus any `<think>` block: a small policy that
    ignores the format still gets a usable next segment, and the trainer sees the same tokens."""
    found = _SUMMARY_TAG.findall(text)
    return (found[-1] if found else _THINK.sub("", text)).strip()


def continuation_messages(prompt: Sequence[Message], summary: str,
                          template: str = CONTINUATION_TEMPLATE) -> list[Message]:
    """The next segment's initial messages: s_1 with `template.format(summary=…)` appended to
    its last user message (algorithms.md §4.1, App. C.1.1)."""
    last_user = max((i for i, m in enumerate(prompt) if m.get("role") == "user"), default=None)
    if last_user is None:
        raise ValueError("the initial prompt has no user message to continue from")
    out = [Message(**m) for m in prompt]  # type: ignore[typeddict-item]
    out[last_user] = Message(**{**prompt[last_user],  # type: ignore[typeddict-item]
                                "content": prompt[last_user].get("content", "") + template.format(summary=summary)})
    return out


@dataclass(frozen=True)
class SupoPolicy:
    """SUPO summarisation as a context policy (agentrl.rollout.ContextPolicy).

    working_context (W): the token budget of one segment's context.
    ratio: the trigger threshold L = ⌊ratio·W⌋.
    max_summaries (S): summaries allowed per rollout; one more trigger makes it overlong.
    max_steps (H): policy generations (actions and summaries) per rollout.
    """

    working_context: int = 4096
    ratio: float = 0.95
    max_summaries: int = 7
    max_steps: int = 100
    summary_prompt: str = SUMMARY_PROMPT
    continuation_template: str = CONTINUATION_TEMPLATE

    def __post_init__(self) -> None:
        if not (isinstance(self.working_context, int) and self.working_context > 0):
            raise ValueError(f"working_context must be a positive int, got {self.working_context!r}")
        if not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")
        if self.max_summaries < 0:
            raise ValueError(f"max_summaries must be >= 0, got {self.max_summaries}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if "{summary}" not in self.continuation_template:
            raise ValueError("continuation_template must contain the '{summary}' placeholder")

    @classmethod
    def from_config(cls, cfg: Any) -> SupoPolicy:
        """From `agentrl.config.SummarizeConfig` (working_context, ratio, max_summaries, max_steps)."""
        return cls(cfg.working_context, cfg.ratio, cfg.max_summaries, cfg.max_steps)

    @property
    def threshold(self) -> int:
        return summary_threshold(self.working_context, self.ratio)

    @property
    def max_compactions(self) -> int:
        return self.max_summaries

    @property
    def drop_last_pair(self) -> bool:
        return True  # SUPO Alg. 2 line 11

    def compaction_request(self) -> Message:
        return Message(role="user", content=self.summary_prompt)

    def extract(self, text: str) -> str:
        return extract_summary(text)

    def next_context(self, initial: Sequence[Message], context: Sequence[Message],
                     extracted: str | None) -> list[Message]:
        return continuation_messages(initial, extracted or "", self.continuation_template)


_POLICY_FIELDS = frozenset(f.name for f in fields(SupoPolicy)) | {"threshold"}


class SummarizeEnv(Env):
    """SUPO wrapper: the inner env plus its `SupoPolicy` (W, ratio, S, H and the summary texts,
    also readable as attributes of the env).

    inner_env: an env object, or a registered env name built with `make(name, **inner_kwargs)`
    (so `make("summarize", inner_env="code")` works; the default wraps `code`).
    """

    def __init__(self, inner_env: Any = "code", working_context: int = 4096, ratio: float = 0.95,
                 max_summaries: int = 7, max_steps: int = 100, *, summary_prompt: str = SUMMARY_PROMPT,
                 continuation_template: str = CONTINUATION_TEMPLATE,
                 inner_kwargs: dict[str, Any] | None = None) -> None:
        policy = SupoPolicy(working_context, ratio, max_summaries, max_steps, summary_prompt, continuation_template)
        if isinstance(inner_env, str):
            inner_env = make(inner_env, **(inner_kwargs or {}))
        elif inner_kwargs:
            raise ValueError("inner_kwargs only apply when inner_env is an env name")
        if isinstance(inner_env, SummarizeEnv):
            raise ValueError("SummarizeEnv would wrap another SummarizeEnv; wrap the inner env once")
        for name in ("areset", "astep"):
            if not callable(getattr(inner_env, name, None)):
                raise TypeError(f"SummarizeEnv needs an env with async {name}(); got {type(inner_env).__name__}")
        super().__init__(split=getattr(inner_env, "split", "train"))
        self.inner = inner_env
        self.context_policy = policy

    @classmethod
    def from_config(cls, inner_env: Any, cfg: Any) -> SummarizeEnv:
        """From `agentrl.config.SummarizeConfig` (working_context, ratio, max_summaries, max_steps)."""
        return cls(inner_env, cfg.working_context, cfg.ratio, cfg.max_summaries, cfg.max_steps)

    @property
    def name(self) -> str:
        return f"summarize({getattr(self.inner, 'name', type(self.inner).__name__)})"

    def summary_message(self) -> Message:
        return self.context_policy.compaction_request()

    def extract_summary(self, text: str) -> str:
        return extract_summary(text)

    def continuation(self, prompt: Sequence[Message], summary: str) -> list[Message]:
        return continuation_messages(prompt, summary, self.continuation_template)

    # -- delegation: the env itself is untouched; its state survives across segments --------

    async def areset(self, task: Task) -> list[Message]:
        return await self.inner.areset(task)

    async def astep(self, action: str) -> StepResult:
        return await self.inner.astep(action)

    async def afinalize(self) -> tuple[float, dict[str, float]] | None:
        finalize = getattr(self.inner, "afinalize", None)  # any object with areset/astep may be wrapped
        return await finalize() if finalize is not None else None

    def tasks(self, split: str = "train") -> Any:
        return self.inner.tasks(split)

    _delegates_demos = True  # has_demonstrations looks at the inner env

    async def demonstrate(self, task: Task, seed: int = 0) -> list[str]:
        """The inner env's demonstration (with the seed when it takes one)."""
        return await call_demonstrate(self.inner, task, seed)

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()

    def __getattr__(self, name: str) -> Any:  # SUPO's parameters; the inner env's tasks, state, tools, ...
        if name in ("inner", "context_policy"):  # not yet set (during unpickling): avoid infinite recursion
            raise AttributeError(name)
        if name in _POLICY_FIELDS:
            return getattr(self.context_policy, name)
        return getattr(self.inner, name)
