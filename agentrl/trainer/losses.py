"""Policy losses, off-policy corrections, Trust Region Masking and aggregation (pure functions).

Every per-token function takes [B, T] tensors and returns [B, T] losses (to be *minimised*); the
aggregation function turns them into one scalar. Notation follows algorithms.md §0.1:
π_roll (behaviour, from the inference engine), π_old = π_prox (trainer recomputation at the start
of the batch, frozen), π_θ (current).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

LOG_RATIO_BOUND = 20.0  # verl SAFETY_BOUND, algorithms.md §2.4 edge cases

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
TRMMode = Literal["off", "max", "avg", "both"]


def safe_ratio(log_ratio: Tensor) -> Tensor:
    """exp(log ρ) with log ρ clamped to [−20, 20] (algorithms.md §2.4)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


# ---------------------------------------------------------------------------------------------
# Policy-gradient losses
# ---------------------------------------------------------------------------------------------


def ppo_clip_loss(ratio: Tensor, advantages: Tensor, clip_low: float = 0.2, clip_high: float = 0.28,
                  dual_clip: float | None = None) -> tuple[Tensor, Tensor]:
    """Token-level PPO clip with decoupled bounds (DAPO clip-higher, algorithms.md §5.2(1)):
    ℓ = max(−Â·r, −Â·clip(r, 1−ε_low, 1+ε_high)).

    Dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games"): for Â < 0 the loss is
    further capped at −c·Â, bounding the TRM "leak" of §2.4 / §5.4 test 1.
    Returns (per-token loss, float mask of tokens whose gradient the clip removed)."""
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        is_clipped = is_clipped | dual
    return loss, is_clipped.float()


def behaviour_weights(prox_logprobs: Tensor, behaviour_logprobs: Tensor, cap: float | None) -> Tensor:
    """Off-policy weight w_t = π_prox/π_behav, detached.

    cap=None: AReaL's decoupled weight (arXiv 2505.24298 Eq. 5, algorithms.md §8.2).
    cap=C: token-level truncated IS, min(w, C) (Yao et al., algorithms.md §8.3; default C=2)."""
    w = safe_ratio(prox_logprobs - behaviour_logprobs).detach()
    return w.clamp(max=cap) if cap is not None else w


def decoupled_ppo_loss(logprobs: Tensor, prox_logprobs: Tensor, behaviour_logprobs: Tensor,
                       advantages: Tensor, clip_low: float = 0.2, clip_high: float = 0.28,
                       dual_clip: float | None = None, tis_cap: float | None = None
                       ) -> tuple[Tensor, Tensor]:
    """AReaL decoupled PPO (arXiv 2505.24298 Eq. 5, algorithms.md §8.2, §2.4 5(a)):
    ℓ = w_t · max(−u Â, −clip(u, 1−ε_low, 1+ε_high) Â), u = π_θ/π_prox, w_t = sg[π_prox/π_behav]
    (truncated at `tis_cap` when given, §8.3). Returns (per-token loss, clipped mask)."""
    ratio = safe_ratio(logprobs - prox_logprobs)
    loss, clipped = ppo_clip_loss(ratio, advantages, clip_low, clip_high, dual_clip)
    return behaviour_weights(prox_logprobs, behaviour_logprobs, tis_cap) * loss, clipped


def reinforce_loss(logprobs: Tensor, behaviour_logprobs: Tensor, advantages: Tensor,
                   tis_cap: float | None = 2.0) -> Tensor:
    """TRM paper's REINFORCE surrogate with truncated IS (algorithms.md §2.4 5(c), §8.3):
    ℓ = −sg[min(ρ_t, C)] · log π_θ · Â, ρ_t = π_θ/π_roll."""
    w = behaviour_weights(logprobs.detach(), behaviour_logprobs, tis_cap)
    return -w * logprobs * advantages


def gspo_sequence_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """GSPO (arXiv 2507.18071, algorithms.md §8.4): s_i = exp((1/|y_i|) Σ_t log(π_θ/π_old)),
    one value per sequence [B]; sequences with no policy token get 1."""
    m = mask.float()
    return torch.exp((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1))


def gspo_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    clip_low: float = 3e-4, clip_high: float = 4e-4) -> tuple[Tensor, Tensor]:
    """GSPO-token (algorithms.md §8.4): s_{i,t} = sg[s_i] · π_θ(y_t)/sg[π_θ(y_t)], then the
    clipped objective per token. Numerically and in gradient equal to sequence-level GSPO when
    Â_{i,t} = Â_i (use seq-mean-token-mean aggregation for GSPO's 1/G Σ_i form).
    Returns (per-token loss, clipped mask)."""
    s = gspo_sequence_ratio((logprobs - old_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND), mask)
    s_tok = s.detach().unsqueeze(-1) * torch.exp(logprobs - logprobs.detach())
    return ppo_clip_loss(s_tok, advantages, clip_low, clip_high)


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ‖π_ref) per token (Schulman; GRPO, algorithms.md §8.1):
    π_ref/π_θ − log(π_ref/π_θ) − 1 ≥ 0."""
    log_ratio = (ref_logprobs - logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.exp(log_ratio) - log_ratio - 1


# ---------------------------------------------------------------------------------------------
# Trust Region Masking (arXiv 2512.23075, algorithms.md §2)
# ---------------------------------------------------------------------------------------------


def k2(log_ratio: Tensor) -> Tensor:
    """k2(ρ) = ½ (log ρ)², symmetric in ρ ↔ 1/ρ (algorithms.md §2.3, criterion 4)."""
    return 0.5 * log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND) ** 2


def k3(log_ratio: Tensor) -> Tensor:
    """k3(ρ) = ρ − 1 − log ρ, unbiased for KL(π_roll‖π_θ) under π_roll (algorithms.md §2.3)."""
    lr = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.exp(lr) - 1 - lr


def exact_kl_from_logits(roll_logits: Tensor, logits: Tensor) -> Tensor:
    """Full-vocabulary KL(π_roll(·|c_t) ‖ π_θ(·|c_t)) per position, forward direction as in TRPO
    (algorithms.md §2.1, TRM-Max exact §2.3 criterion 1). Logits [..., V] → [...]."""
    log_roll = torch.log_softmax(roll_logits.float(), -1)
    log_cur = torch.log_softmax(logits.float(), -1)
    return (log_roll.exp() * (log_roll - log_cur)).sum(-1)


def trm_sequence_mask(mask: Tensor, mode: TRMMode, delta: float, delta_avg: float,
                      log_ratio: Tensor | None = None, token_kl: Tensor | None = None) -> Tensor:
    """Trust Region Masking (arXiv 2512.23075, algorithms.md §2.3): M_i ∈ {0,1} per sequence [B].

    max:  M_i = 1[max_t D_t ≤ δ]      avg: M_i = 1[mean_t D_t ≤ δ_avg]      both: the conjunction.
    With `token_kl` (exact full-vocabulary KL, preferred) D_t is that KL for both criteria;
    otherwise, from the sampled token's log ρ = log π_old − log π_roll: k2 for the max and k3 for
    the average criterion (§2.3 criterion 4). Only policy tokens (mask 1) count. A sequence with no
    policy token is accepted; one with a NaN/inf divergence on a policy token is rejected (§2.4)."""
    if mode not in ("off", "max", "avg", "both"):
        raise ValueError(f"unknown TRM mode {mode!r}; choose off, max, avg or both")
    m = mask.bool()
    if mode == "off":
        return torch.ones(mask.shape[0], dtype=torch.bool)
    if token_kl is not None:
        d_max = d_avg = token_kl.float()
    elif log_ratio is not None:
        d_max, d_avg = k2(log_ratio.float()), k3(log_ratio.float())
        bad = ~torch.isfinite(log_ratio)  # clamp() would hide a NaN-free inf; NaN survives clamp
        d_max, d_avg = d_max.masked_fill(bad, float("nan")), d_avg.masked_fill(bad, float("nan"))
    else:
        raise ValueError("trm_sequence_mask needs log_ratio or token_kl")
    finite = (torch.isfinite(d_max) | ~m).all(-1) & (torch.isfinite(d_avg) | ~m).all(-1)
    zero = torch.zeros((), dtype=d_max.dtype)
    seq_max = torch.where(m, torch.nan_to_num(d_max, nan=0.0), zero).amax(-1)
    seq_avg = torch.where(m, torch.nan_to_num(d_avg, nan=0.0), zero).sum(-1) / m.sum(-1).clamp(min=1)
    accept = finite
    if mode in ("max", "both"):
        accept = accept & (seq_max <= delta)
    if mode in ("avg", "both"):
        accept = accept & (seq_avg <= delta_avg)
    return accept | (m.sum(-1) == 0)


# ---------------------------------------------------------------------------------------------
# Aggregation (algorithms.md §5.2(3), §5.4 test 3, §8.1; TRM divisor rule §2.4)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Denominators:
    """Divisors of a whole mini-batch, so micro-batches with gradient accumulation give the same
    gradient as one big batch. `tokens`/`seqs` count what the normalisation counts: with
    trm_normalize="total" that includes TRM-rejected sequences (§2.4)."""

    tokens: float
    seqs: float
    scale: float = 1.0  # seq-mean-token-sum-norm constant (Dr.GRPO loss_scale_factor)


def denominators(norm_mask: Tensor, mode: AggMode, loss_scale_factor: float | None = None) -> Denominators:
    """Denominators of `aggregate_loss` for a batch whose counting mask is `norm_mask` [B, T]."""
    m = norm_mask.float()
    scale = loss_scale_factor if loss_scale_factor is not None else float(m.shape[-1])
    return Denominators(tokens=max(float(m.sum()), 1.0), seqs=max(float((m.sum(-1) > 0).sum()), 1.0),
                        scale=scale)


def aggregate_loss(per_token: Tensor, mask: Tensor, mode: AggMode, norm_mask: Tensor | None = None,
                   denom: Denominators | None = None) -> Tensor:
    """Reduce [B, T] per-token losses to a scalar.

    token-mean               Σ ℓ m / Σ m                         (DAPO token-level, §5.2(3))
    seq-mean-token-mean      Σ_i (Σ_t ℓ m / |o_i|) / #seqs       (GRPO sample mean)
    seq-mean-token-sum       Σ_i Σ_t ℓ m / #seqs
    seq-mean-token-sum-norm  Σ_i Σ_t ℓ m / scale                 (Dr.GRPO constant, §8.1)

    `mask` selects the tokens that contribute (after TRM); `norm_mask` the tokens that count in the
    divisors (before TRM for trm_normalize="total", §2.4; defaults to `mask`). `denom` overrides
    the divisors with whole-mini-batch counts for micro-batching."""
    norm_mask = mask if norm_mask is None else norm_mask
    denom = denom or denominators(norm_mask, mode)
    contrib = per_token * mask.float()
    if mode == "token-mean":
        return contrib.sum() / denom.tokens
    if mode == "seq-mean-token-mean":
        per_seq = contrib.sum(-1) / norm_mask.float().sum(-1).clamp(min=1)
        return per_seq.sum() / denom.seqs
    if mode == "seq-mean-token-sum":
        return contrib.sum() / denom.seqs
    if mode == "seq-mean-token-sum-norm":
        return contrib.sum() / denom.scale
    raise ValueError(f"unknown loss aggregation {mode!r}; choose token-mean, seq-mean-token-mean, "
                     "seq-mean-token-sum or seq-mean-token-sum-norm")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over mask=1 entries (0 when the mask is empty); for metrics."""
    m = mask.float()
    return (x * m).sum() / m.sum().clamp(min=1)


def sft_loss(token_logprobs: Tensor, loss_mask: Tensor, num_tokens: float | None = None) -> Tensor:
    """Mean negative log-likelihood of the masked tokens: Σ −log π(token)·mask / num_tokens
    (default: the mask's own sum; pass the whole optimizer step's count when accumulating).
    The warm start's loss, and the replay term of an RL step (`Learner.replay_backward`)."""
    n = float(loss_mask.sum()) if num_tokens is None else float(num_tokens)
    return -(token_logprobs * loss_mask).sum() / max(n, 1.0)
