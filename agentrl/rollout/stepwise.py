"""Token rows from the policy requests of one episode: one growing sequence when each request's
prompt extends the previous prompt and sample token for token ("append"), else one row per
request ("stepwise": a chat template rewrote earlier turns, e.g. dropped past `<think>` blocks).

Both the rollout engine (built-in envs) and the policy endpoint (agent programs) record each
request as a `Sample` and build the trajectory's segments here, so the rule is written once.
A step-wise row holds exactly the prompt the policy saw and the tokens it sampled under it: no
row contains a token the policy did not sample under its own prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from agentrl.types import Segment, Turn

APPEND = "append"
STEPWISE = "stepwise"


@dataclass
class Sample:
    """One policy request: the prompt it saw and what it sampled under it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int
    text: str = ""  # the completion as text (the Turn's action_text)
    finish_reason: str = "stop"
    generate_seconds: float = 0.0
    # The first request's closed prompt (before the generation prompt), as the rollout engine counts
    # a context's prompt; None: all of prompt_ids.
    prompt_len: int | None = None


def starts_with(ids: Sequence[int], history: Sequence[int]) -> bool:
    """Whether `ids` begins with `history`, token for token (the append rule)."""
    return len(ids) >= len(history) and list(ids[: len(history)]) == list(history)


def extends(previous: Sample, prompt_ids: Sequence[int]) -> bool:
    """Whether `prompt_ids` starts with `previous`'s prompt and sample, token for token."""
    return starts_with(prompt_ids, previous.prompt_ids + previous.completion_ids)


def episode_mode(samples: Sequence[Sample]) -> str:
    """APPEND when every request extends the one before it, else STEPWISE."""
    ok = all(extends(a, b.prompt_ids) for a, b in pairwise(samples))
    return APPEND if ok else STEPWISE


def _policy_turn(seg: Segment, sample: Sample) -> Turn:
    start = len(seg.token_ids)
    seg.append(list(sample.completion_ids), policy=True, logprobs=list(sample.logprobs), version=sample.version)
    turn = Turn(action_text=sample.text, action_start=start, action_end=len(seg.token_ids),
                finish_reason=sample.finish_reason, generate_seconds=sample.generate_seconds)
    seg.turns.append(turn)
    return turn


def segments_from_samples(samples: Sequence[Sample]) -> tuple[list[Segment], str]:
    """The episode's segments and its mode. APPEND: one segment, the first prompt (mask 0), then
    each sample (mask 1) followed by the tokens the next prompt adds (observations, mask 0).
    STEPWISE: one segment per sample, its prompt (mask 0) and its sample (mask 1)."""
    if not samples:
        return [], APPEND
    mode = episode_mode(samples)
    if mode == STEPWISE:
        segments = []
        for sample in samples:
            seg = Segment(prompt_len=len(sample.prompt_ids))
            seg.append(list(sample.prompt_ids), policy=False)
            _policy_turn(seg, sample)
            segments.append(seg)
        return segments, mode
    first = samples[0]
    seg = Segment(prompt_len=len(first.prompt_ids) if first.prompt_len is None else first.prompt_len)
    seg.append(list(samples[0].prompt_ids), policy=False)
    for sample, following in zip(samples, [*samples[1:], None]):
        turn = _policy_turn(seg, sample)
        if following is not None:
            turn.obs_start = len(seg.token_ids)
            seg.append(list(following.prompt_ids[len(seg.token_ids):]), policy=False)
            turn.obs_end = len(seg.token_ids)
    return [seg], mode
