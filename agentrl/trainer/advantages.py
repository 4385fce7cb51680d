"""Advantage estimators: GRPO, Dr.GRPO, RLOO, SUPO broadcast and OTB (pure functions).

Group-level estimators take one scalar reward per rollout and a group index per rollout, and
return one scalar advantage per rollout; the batch builder broadcasts it to every policy token of
every segment (SUPO, algorithms.md §4.2). OTB returns per-token advantages (§6).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Singleton = Literal["reward", "zero"]


def _check_groups(rewards: Tensor, group_index: Tensor) -> None:
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(f"rewards and group_index must be 1-D of equal length, got "
                         f"{tuple(rewards.shape)} and {tuple(group_index.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError(f"rewards must be finite, got {rewards.tolist()}")


def _per_group(rewards: Tensor, group_index: Tensor, fn, singleton: Singleton) -> Tensor:
    """Apply `fn(group_rewards) -> group_advantages` to each group (G ≥ 2).

    G = 1 has no baseline: `singleton="reward"` follows verl (mean 0, std 1, so A = R; flagged in
    algorithms.md §8.1), `"zero"` follows SUPO's recommendation (§4.3 edge cases)."""
    _check_groups(rewards, group_index)
    rewards = rewards.double()
    out = torch.zeros_like(rewards)
    for g in group_index.unique():
        idx = (group_index == g).nonzero(as_tuple=True)[0]
        r = rewards[idx]
        if len(idx) == 1:
            out[idx] = r if singleton == "reward" else 0.0
        else:
            out[idx] = fn(r)
    return out.float()


def grpo_advantages(rewards: Tensor, group_index: Tensor, eps: float = 1e-6,
                    singleton: Singleton = "reward") -> Tensor:
    """GRPO (DeepSeekMath) outcome advantage, algorithms.md §8.1 and SUPO Eq. 3 (§4.2):
    Â_i = (R_i − mean_g R) / (std_g R + eps), unbiased std (torch.std, N−1), eps = 1e-6.
    A zero-variance group gets 0 everywhere."""
    return _per_group(rewards, group_index, lambda r: (r - r.mean()) / (r.std() + eps), singleton)


def drgrpo_advantages(rewards: Tensor, group_index: Tensor, singleton: Singleton = "reward") -> Tensor:
    """Dr.GRPO ("Understanding R1-Zero-like Training"), algorithms.md §8.1: Â_i = R_i − mean_g R
    (no std normalisation)."""
    return _per_group(rewards, group_index, lambda r: r - r.mean(), singleton)


def rloo_advantages(rewards: Tensor, group_index: Tensor, singleton: Singleton = "reward") -> Tensor:
    """RLOO (Ahmadian et al. 2024, leave-one-out baseline), architecture.md §8:
    Â_i = R_i − mean_{j≠i} R_j = G/(G−1) · (R_i − mean_g R)."""
    return _per_group(rewards, group_index, lambda r: (r - r.mean()) * len(r) / (len(r) - 1), singleton)


def supo_advantages(rewards: Tensor, group_index: Tensor, overlong: Tensor, eps: float = 1e-6,
                    singleton: Singleton = "reward", estimator: str = "grpo") -> Tensor:
    """SUPO rollout advantage, algorithms.md §4.2 (Eq. 3) and §4.3 `supo_advantage`.

    Statistics are over rollouts (one entry per rollout, never per segment). Overlong rollouts
    count in their group's mean and std but get advantage 0 (their loss mask is 0 too)."""
    if overlong.shape != rewards.shape:
        raise ValueError(f"overlong must have one flag per rollout, got {tuple(overlong.shape)}")
    adv = group_advantages(estimator, rewards, group_index, eps=eps, singleton=singleton)
    return adv * (~overlong.bool()).float()


def broadcast_to_segments(rollout_advantages: Tensor, segment_rollout: Tensor) -> Tensor:
    """SUPO (algorithms.md §4.2): every segment of rollout g gets Â_g. segment_rollout[s] is the
    rollout index of segment s."""
    if segment_rollout.numel() and (segment_rollout.min() < 0
                                    or segment_rollout.max() >= len(rollout_advantages)):
        raise ValueError("segment_rollout holds an index outside the rollouts")
    return rollout_advantages[segment_rollout]


def group_advantages(name: str, rewards: Tensor, group_index: Tensor, eps: float = 1e-6,
                     singleton: Singleton = "reward") -> Tensor:
    """Dispatch to a scalar group estimator by config name (trainer.advantage)."""
    if name == "grpo":
        return grpo_advantages(rewards, group_index, eps=eps, singleton=singleton)
    if name == "drgrpo":
        return drgrpo_advantages(rewards, group_index, singleton=singleton)
    if name == "rloo":
        return rloo_advantages(rewards, group_index, singleton=singleton)
    raise ValueError(f"unknown advantage estimator {name!r}; choose grpo, drgrpo or rloo")


# ---------------------------------------------------------------------------------------------
# OTB — Optimal Token Baseline with the logit-gradient proxy (algorithms.md §6)
# ---------------------------------------------------------------------------------------------


def logit_gradient_energy(old_logprobs: Tensor, sum_pi_sq: Tensor,
                          is_weights: Tensor | None = None) -> Tensor:
    """OTB logit-gradient proxy, algorithms.md §6.1: ‖e_y − π‖² = 1 − 2π(y) + Σ_v π(v)², with
    π(y) = exp(log π_old(y)); times ρ̄² when truncated rollout-IS weights are in use."""
    w = 1 - 2 * old_logprobs.exp() + sum_pi_sq
    return w * is_weights ** 2 if is_weights is not None else w


def _compress(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Left-align each row's policy tokens (multi-turn OTB drops tool tokens, §6.2).
    Returns the compressed values [N, L] and their validity mask."""
    mask = mask.bool()
    lengths = mask.sum(-1)
    width = int(lengths.max()) if len(lengths) else 0
    out = x.new_zeros(x.shape[0], width)
    valid = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    out[valid] = x[mask]
    return out, valid


def _expand(compressed: Tensor, mask: Tensor) -> Tensor:
    """Inverse of `_compress`: scatter values back to the policy positions (0 elsewhere)."""
    mask = mask.bool()
    out = compressed.new_zeros(mask.shape)
    valid = torch.arange(compressed.shape[1]).unsqueeze(0) < mask.sum(-1).unsqueeze(1)
    out[mask] = compressed[valid]
    return out


def otb_advantages(token_rewards: Tensor, mask: Tensor, group_index: Tensor, old_logprobs: Tensor,
                   sum_pi_sq: Tensor, is_weights: Tensor | None = None, eps: float = 1e-8,
                   zero_tail: bool = False) -> tuple[Tensor, Tensor]:
    """Optimal Token Baseline (arXiv 2602.07078; verl `compute_optimal_token_baseline_advantage`),
    algorithms.md §6.1 and §6.3:

        G_t = Σ_{j≥t} r_j m_j,   W_t = Σ_{j≤t} m_j (1 − 2π_j + Σπ²_j),
        B*_t = Σ_i G_t W_t m_t / (Σ_i W_t m_t + eps),   Â_t = (G_t − B*_t) m_t.

    Policy tokens are first compressed to positions 0..T_i−1 (multi-turn alignment, §6.2), so
    tool tokens are skipped. Groups of one get no baseline (Â = G). `zero_tail` sets the baseline
    of a unique longest trajectory to 0 beyond the second-longest length. All inputs [N, T]
    except group_index [N]. Returns (advantages, returns), both [N, T]."""
    shapes = {tuple(t.shape) for t in (token_rewards, mask, old_logprobs, sum_pi_sq)}
    if len(shapes) != 1 or token_rewards.dim() != 2 or group_index.shape != token_rewards.shape[:1]:
        raise ValueError("otb_advantages: token tensors must share one [N, T] shape and group_index be [N]")
    m = mask.float()
    returns = (token_rewards * m).flip(-1).cumsum(-1).flip(-1) * m
    energy = logit_gradient_energy(old_logprobs, sum_pi_sq, is_weights) * m
    g, valid = _compress(returns, mask)
    w, _ = _compress(energy, mask)
    w = w.cumsum(-1) * valid
    baseline = torch.zeros_like(g)
    lengths = valid.sum(-1)
    for gid in group_index.unique():
        idx = (group_index == gid).nonzero(as_tuple=True)[0]
        if len(idx) == 1:
            continue
        num = (g[idx] * w[idx]).sum(0)
        den = w[idx].sum(0) + eps
        baseline[idx] = (num / den).unsqueeze(0).expand(len(idx), -1) * valid[idx]
        if zero_tail:
            lens, order = lengths[idx].sort(descending=True)
            if lens[0] > lens[1]:  # exactly one strictly longest trajectory
                baseline[idx[order[0]], int(lens[1]):] = 0.0
    adv = _expand(g - baseline, mask) * m
    return adv, returns
