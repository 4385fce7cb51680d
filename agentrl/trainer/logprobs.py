"""Per-token log-probs (and entropy, Σπ²) of a causal LM on given token ids.

The trainer's view of the policy: `out[:, t] = log π(input_ids[:, t] | input_ids[:, <t])`
computed from `log_softmax(logits / temperature)` in fp32, so it matches the distribution the
inference engine sampled from at that temperature. Position 0 has no context and gets 0.

The same forward pass also yields the entropy (a metric) and `Σ_v π(v)²`, which OTB's
logit-gradient proxy needs (algorithms.md §6.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class TokenStats:
    """Per-token tensors [B, T], aligned with input_ids; position 0 holds zeros."""

    logprobs: Tensor
    entropy: Tensor
    sum_pi_sq: Tensor


def _check(input_ids: Tensor, attention_mask: Tensor | None, temperature: float) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                         f"{tuple(input_ids.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _logits(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None,
            temperature: float) -> Tensor:
    """fp32 logits predicting tokens 1..T-1, i.e. logits[:, :-1], divided by the temperature."""
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    logits = out.logits if hasattr(out, "logits") else out
    return logits[:, :-1].float() / temperature


def _pad_first(x: Tensor) -> Tensor:
    """Prepend a zero column so position t describes token t (position 0 has no context)."""
    return torch.cat([x.new_zeros(x.shape[0], 1), x], dim=1)


def logprobs_from_logits(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[targets] = z_y − logsumexp(z), per position; logits [..., V], targets [...].
    Gathering before normalising avoids a second [B, T, V] tensor."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H(π) = logsumexp(z) − Σ π z, per position."""
    logits = logits.float()
    pi = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (pi * logits).sum(-1)


def sum_pi_sq_from_logits(logits: Tensor) -> Tensor:
    """Σ_v π(v)² = exp(logsumexp(2z) − 2·logsumexp(z)) (OTB, algorithms.md §6.1)."""
    logits = logits.float()
    return torch.exp(torch.logsumexp(2 * logits, dim=-1) - 2 * torch.logsumexp(logits, dim=-1))


def token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                   temperature: float = 1.0) -> Tensor:
    """[B, T] log π(input_ids[:, t] | input_ids[:, <t]) at `temperature`; column 0 is 0.

    Differentiable (call under `torch.no_grad()` for π_old / π_prox recomputation)."""
    _check(input_ids, attention_mask, temperature)
    logits = _logits(model, input_ids, attention_mask, temperature)
    return _pad_first(logprobs_from_logits(logits, input_ids[:, 1:]))


def token_logprobs_and_stats(model: torch.nn.Module, input_ids: Tensor,
                             attention_mask: Tensor | None = None,
                             temperature: float = 1.0) -> TokenStats:
    """Log-probs plus entropy and Σπ² from the same forward pass (all [B, T], column 0 = 0).

    Entropy and Σπ² are detached: they are metrics / OTB weights, never loss terms."""
    _check(input_ids, attention_mask, temperature)
    logits = _logits(model, input_ids, attention_mask, temperature)
    logprobs = _pad_first(logprobs_from_logits(logits, input_ids[:, 1:]))
    with torch.no_grad():
        entropy = _pad_first(entropy_from_logits(logits))
        sum_pi_sq = _pad_first(sum_pi_sq_from_logits(logits))
    return TokenStats(logprobs=logprobs, entropy=entropy, sum_pi_sq=sum_pi_sq)
