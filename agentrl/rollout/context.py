"""Context management as a policy the rollout engine consults at turn boundaries.

The engine owns the token mechanics (what is in the context, rollback, segments); a
`ContextPolicy` decides when the context must be compacted and what the next segment starts
from. SUPO summarisation (algorithms.md §4) is one such policy, provided by the summarize env
wrapper; a truncating or sliding-window manager is another. An env hands its policy over as its
`context_policy` attribute; `RolloutEngine(context_policy=...)` sets one for any env without one.

At each turn boundary, once the segment's tokens reach `threshold`:
  1. if `drop_last_pair`, the last (action, observation) pair leaves the token context (the env
     keeps its effects; SUPO Alg. 2 line 11);
  2. past `max_compactions` compactions the rollout ends overlong;
  3. if `compaction_request()` gives a message, it is appended and the policy model generates
     the compaction text (trained tokens), read by `extract(text)`;
  4. the next segment starts from `next_context(initial_messages, context, extracted)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from agentrl.types import Message


@runtime_checkable
class ContextPolicy(Protocol):
    """What the rollout engine asks a context manager (see the module docstring for the order)."""

    @property
    def working_context(self) -> int:
        """Token budget of one segment while acting (an action's generation stops there)."""
        ...

    @property
    def threshold(self) -> int:
        """Segment length (tokens) at a turn boundary that triggers a compaction."""
        ...

    @property
    def max_compactions(self) -> int:
        """Compactions allowed per rollout; one more trigger makes it overlong."""
        ...

    @property
    def max_steps(self) -> int:
        """Policy generations (actions and compaction texts) per rollout; past it, overlong."""
        ...

    @property
    def drop_last_pair(self) -> bool:
        """Whether the pair that crossed the threshold leaves the token context first."""
        ...

    def compaction_request(self) -> Message | None:
        """The message asking the policy to write the compaction text; None: no generation."""
        ...

    def extract(self, text: str) -> str:
        """The part of the generated compaction text the next segment keeps."""
        ...

    def next_context(self, initial: Sequence[Message], context: Sequence[Message],
                     extracted: str | None) -> list[Message]:
        """The messages the next segment starts from."""
        ...


def context_policy_of(env: object, default: ContextPolicy | None = None) -> ContextPolicy | None:
    """The env's own context policy (`env.context_policy`), else `default`."""
    policy = getattr(env, "context_policy", None)
    if policy is None:
        return default
    if not isinstance(policy, ContextPolicy):
        raise TypeError(f"{type(env).__name__}.context_policy must implement agentrl.rollout.ContextPolicy, "
                        f"got {type(policy).__name__}")
    return policy
