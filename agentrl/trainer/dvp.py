"""Dynamic Vocabulary Pruning, "Taming the Tail" (arXiv 2512.23087), algorithms.md §7 — pure functions.

Only the abstract was available, so the safe-set construction and the pruned objective follow
the [INFERRED] design of §7.2: per position keep V_safe = {v : π(v) ≥ α·max_u π(u)} (min-p; or a
nucleus), renormalise the policy on it, and mask sampled tokens that fall outside it. All
functions take logits [..., V] and work in log space so tiny tail probabilities do not underflow.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha <= 1:
        raise ValueError(f"min-p alpha must be in (0, 1], got {alpha!r}")


def min_p_safe_set(logits: Tensor, alpha: float) -> Tensor:
    """DVP safe vocabulary, min-p rule (algorithms.md §7.2): V_safe = {v : π(v) ≥ α·max_u π(u)},
    i.e. z_v − max_u z_u ≥ log α (the softmax normaliser cancels). Returns a bool mask [..., V];
    the argmax is always in it, so the pruned policy is never empty."""
    _check_alpha(alpha)
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [..., V] with V >= 1, got shape {tuple(logits.shape)}")
    z = logits.float()
    return z - z.amax(-1, keepdim=True) >= math.log(alpha)


def top_p_safe_set(logits: Tensor, top_p: float) -> Tensor:
    """DVP safe vocabulary, nucleus alternative (algorithms.md §7.2): the smallest set of the most
    probable tokens whose mass is ≥ top_p. Returns a bool mask [..., V]."""
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    probs, order = torch.softmax(logits.float(), -1).sort(-1, descending=True)
    mass_before = probs.cumsum(-1) - probs  # mass of the strictly more probable tokens
    keep_sorted = mass_before < top_p  # a token is needed while the mass so far is short of p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def pruned_logprobs(logits: Tensor, safe: Tensor) -> Tensor:
    """Pruned, renormalised policy (algorithms.md §7.2): log π̃(v) = z_v − logsumexp_{u∈V_safe} z_u
    on V_safe and −inf outside. [..., V] → [..., V]."""
    if safe.shape != logits.shape:
        raise ValueError(f"safe mask shape {tuple(safe.shape)} != logits shape {tuple(logits.shape)}")
    return torch.log_softmax(logits.float().masked_fill(~safe, float("-inf")), -1)


def pruned_mass(logits: Tensor, safe: Tensor) -> Tensor:
    """m_t = Σ_{v∉V_safe} π(v) = TV(π̃, π), the per-step bias of pruning (algorithms.md §7.2).
    With R ∈ [0, 1] the objective bias is at most Σ_t E[m_t]. [..., V] → [...]."""
    logp = torch.log_softmax(logits.float(), -1)
    return -torch.expm1(torch.logsumexp(logp.masked_fill(~safe, float("-inf")), -1))


def out_of_support(safe: Tensor, tokens: Tensor) -> Tensor:
    """True where the sampled token is outside the training-side V_safe (algorithms.md §7.2
    out-of-support guard: mask the token; under TRM reject the sequence). safe [..., V],
    tokens [...] → bool [...]."""
    if safe.shape[:-1] != tokens.shape:
        raise ValueError(f"tokens shape {tuple(tokens.shape)} must equal safe.shape[:-1] "
                         f"{tuple(safe.shape[:-1])}")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= safe.shape[-1]):
        raise ValueError(f"token ids must be in [0, {safe.shape[-1]}), got range "
                         f"[{int(tokens.min())}, {int(tokens.max())}]")
    return ~safe.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def pruned_token_logprobs(logits: Tensor, tokens: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
    """log π̃_θ(y_t) for the sampled tokens under the min-p safe set of the *training* logits, and
    the out-of-support mask (algorithms.md §7.2 "Training"). Out-of-support tokens get log-prob 0
    (a finite placeholder: their loss mask must be 0). logits [..., V], tokens [...] → two [...]."""
    safe = min_p_safe_set(logits, alpha)
    oos = out_of_support(safe, tokens)
    logp = pruned_logprobs(logits, safe).gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return logp.masked_fill(oos, 0.0), oos


def mismatch_bound(p: Tensor | float, eps: float) -> Tensor:
    """First-order bound on the train–inference log-prob mismatch (DVP abstract's (1−p) scaling,
    derivation in algorithms.md §7.1): logits z vs z+δ with ‖δ‖_∞ ≤ ε give
    |log π'(y) − log π(y)| ≈ |Σ_v π(v)(δ_y − δ_v)| ≤ 2ε(1 − π(y))."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    return 2 * eps * (1 - torch.as_tensor(p, dtype=torch.float64))


def exact_mismatch_bound(p: Tensor | float, eps: float) -> Tensor:
    """Exact (all-orders) worst case of |log π'(y) − log π(y)| for ‖δ‖_∞ ≤ ε, completing the
    first-order §7.1 derivation (not in algorithms.md): the mismatch is δ_y − log Σ_v π(v)e^{δ_v},
    extreme at δ_y = −ε, δ_{v≠y} = +ε, which gives log(1 + (1−p)(e^{2ε} − 1)). It equals
    2ε(1−p) + 2ε²p(1−p) + O(ε³), so it exceeds the first-order bound by a second-order term."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    return torch.log1p((1 - torch.as_tensor(p, dtype=torch.float64)) * math.expm1(2 * eps))
