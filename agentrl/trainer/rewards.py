"""Reward shaping and group filtering: G-RA / D-RA, DAPO soft overlong punishment, DAPO dynamic
sampling (algorithms.md §3, §5.2; composition order §9 step 2–3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


def gated_accumulation(channels: Sequence[float], thresholds: Sequence[float]) -> float:
    """G-RA multi-priority form (arXiv 2508.10548, algorithms.md §3.1):
    R = Σ_k g_k R^(k), g_k = Π_{j<k} 1[R^(j) ≥ δ_j].

    `channels` are in priority order (outcome first); `thresholds[j]` gates the channels after j,
    so len(thresholds) == len(channels) − 1. Accumulation stops at the first channel below its
    threshold (that channel itself still counts)."""
    if len(thresholds) != len(channels) - 1:
        raise ValueError(f"need {len(channels) - 1} thresholds for {len(channels)} reward channels, "
                         f"got {len(thresholds)}")
    total = 0.0
    for k, r in enumerate(channels):
        total += r
        if k < len(thresholds) and not r >= thresholds[k]:  # "meet" the threshold: ≥ (§3.3)
            break
    return total


def g_ra(outcome: float, step_rewards: Sequence[float], gate: float | None) -> float:
    """G-RA two-level case (algorithms.md §3.1, §3.3): R̃ = r_high + (Σ_t r_low_t if r_high ≥ Δ).
    gate=None gives D-RA, the ungated baseline R = r_high + Σ_t r_low_t."""
    if gate is None:
        return outcome + sum(step_rewards)
    return gated_accumulation([outcome, sum(step_rewards)], [gate])


def overlong_penalty(length: int, max_len: int, cache_len: int, penalty_factor: float = 1.0,
                     truncated: bool = False) -> float:
    """DAPO soft overlong punishment (arXiv 2503.14476, algorithms.md §5.2(4)), added to the
    correctness reward:
        0                                  if |y| ≤ L_max − L_cache
        ((L_max − L_cache) − |y|)/L_cache  if L_max − L_cache < |y| ≤ L_max
        −1                                 if |y| > L_max, or truncated at the cap
    all times `penalty_factor` (verl's form)."""
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    expected = max_len - cache_len
    if truncated or length > max_len:
        return -1.0 * penalty_factor
    return min((expected - length) / cache_len, 0.0) * penalty_factor


def has_reward_variance(rewards: Sequence[float]) -> bool:
    """DAPO dynamic-sampling criterion (algorithms.md §5.2(2)): keep a group unless all its
    rewards are equal (all correct or all wrong gives zero advantage, hence zero gradient)."""
    return len(rewards) > 0 and max(rewards) > min(rewards)


def filter_groups(groups: Sequence[T], rewards_of: Callable[[T], Sequence[float]]) -> list[T]:
    """DAPO dynamic sampling as a pure filter: drop zero-variance groups (§5.4 test 4)."""
    return [g for g in groups if has_reward_variance(rewards_of(g))]


class DynamicSampler(Generic[T]):
    """DAPO dynamic sampling with refill (algorithms.md §5.2(2), §5.4 test 4).

    Feed each generation batch of groups to `add`; when `ready`, `take()` returns exactly
    `target` qualified groups (surplus truncated) and resets. Raises after `max_num_gen_batches`
    batches without reaching the target (≤ 0 means unlimited). `strict=False` gives up without
    raising: `exhausted` turns true and `take()` returns the groups kept so far (maybe none), so a
    long run is not lost to one step whose prompts were all solved or all failed."""

    def __init__(self, target: int, rewards_of: Callable[[T], Sequence[float]],
                 max_num_gen_batches: int = 10, strict: bool = True) -> None:
        if target < 1:
            raise ValueError(f"target must be >= 1 groups, got {target}")
        self.target, self.rewards_of, self.max_num_gen_batches = target, rewards_of, max_num_gen_batches
        self.strict = strict
        self.kept: list[T] = []
        self.num_gen_batches = 0
        self.num_dropped = 0

    @property
    def ready(self) -> bool:
        return len(self.kept) >= self.target

    @property
    def exhausted(self) -> bool:
        """`max_num_gen_batches` batches drawn and still short of the target."""
        return not self.ready and 0 < self.max_num_gen_batches <= self.num_gen_batches

    def add(self, groups: Sequence[T]) -> bool:
        """Add one generation batch; returns `ready`."""
        self.num_gen_batches += 1
        kept = filter_groups(groups, self.rewards_of)
        self.num_dropped += len(groups) - len(kept)
        self.kept.extend(kept)
        if self.exhausted and self.strict:
            raise RuntimeError(f"dynamic sampling: only {len(self.kept)}/{self.target} groups with reward "
                               f"variance after {self.num_gen_batches} generation batches "
                               f"(max_num_gen_batches={self.max_num_gen_batches}); the task set may be "
                               "too easy or too hard")
        return self.ready

    def take(self) -> list[T]:
        if not (self.ready or (self.exhausted and not self.strict)):
            raise RuntimeError(f"dynamic sampling: {len(self.kept)}/{self.target} groups collected, not ready")
        out, self.kept, self.num_gen_batches = self.kept[: self.target], [], 0
        return out
