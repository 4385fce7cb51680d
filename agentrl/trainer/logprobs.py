"""Per-token log-probs (and entropy, Σπ²) of a causal LM on given token ids.

The trainer's view of the policy: `out[:, t] = log π(input_ids[:, t] | input_ids[:, <t])`
computed from `log_softmax(logits / temperature)` in fp32, so it matches the distribution the
inference engine sampled from at that temperature. Position 0 has no context and gets 0.

The same forward pass also yields the entropy (a metric) and `Σ_v π(v)²`, which OTB's
logit-gradient proxy needs (algorithms.md §6.1); each only when asked for.

On the policy-token path the LM head and log-softmax run over chunks of `CHUNK_TOKENS` tokens;
with gradients on, each chunk is checkpointed, so the [N, V] fp32 logits are never all alive and
none is kept for backward (the chunk's head matmul is recomputed there instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from agentrl.attention import SDPA_GQA, SHARED_PREFIX
from agentrl.trainer import shared_prefix

# Policy tokens per LM-head chunk: 256 × V(49152) fp32 = 50 MB of logits; backward holds about
# five such tensors per chunk. Measured on 2 rows × 1150 tokens (SmolLM2-135M, checkpointed
# layers, this CPU): peak activation memory 2.4 GB at 1024 → 1.6 GB at 256, at no cost in speed
# (fwd+bwd 48 s vs 29 s, interleaved in one process: smaller chunks stay in cache).
CHUNK_TOKENS = 256


@dataclass
class TokenStats:
    """Per-token tensors [B, T], aligned with input_ids; position 0 holds zeros. `entropy` and
    `sum_pi_sq` are None when not asked for."""

    logprobs: Tensor
    entropy: Tensor | None
    sum_pi_sq: Tensor | None


def _check(input_ids: Tensor, attention_mask: Tensor | None, temperature: float) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                         f"{tuple(input_ids.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def causal_mask_only(attention_mask: Tensor | None) -> Tensor | None:
    """The mask to hand the model: None when every row is right-padded (ones, then zeros), else
    the mask itself. Under the causal rule a real token never attends to a later position, so
    right padding changes nothing at real positions (pad positions' outputs are never scored),
    and without a mask torch's attention runs causal and skips the blocks above the diagonal
    instead of reading a [B, 1, T, T] mask: a 4 × 1000-token bf16 forward + backward of
    SmolLM2-135M spends 5.6 s in attention instead of 8.1 s (20.7 → 18.7 s in all, this CPU)."""
    return None if shared_prefix.right_padded(attention_mask) else attention_mask


def _logits(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None,
            temperature: float) -> Tensor:
    """fp32 logits predicting tokens 1..T-1, i.e. logits[:, :-1], divided by the temperature."""
    out = model(input_ids=input_ids, attention_mask=causal_mask_only(attention_mask))
    logits = out.logits if hasattr(out, "logits") else out
    return logits[:, :-1].float() / temperature


def _split_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(body, lm_head) of a plain HF causal LM whose logits are lm_head(last hidden state), or
    None for models that post-process logits (soft-capping, scaling), which take the full path."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = getattr(model, "model", None)
    config = getattr(model, "config", None)
    post = any(getattr(config, k, None) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling"))
    if head is None or body is None or post:
        return None
    return body, head


def _packs(model: torch.nn.Module) -> bool:
    """Whether the model attends through `sdpa_gqa`, the attention that reads a packed layout;
    any other would attend across the packed rows."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == SDPA_GQA


def _chunk_stats(head: torch.nn.Module, hidden: Tensor, targets: Tensor, temperature: float,
                 want_entropy: bool, want_sum_pi_sq: bool, stats: list[Tensor]) -> Tensor:
    """log π(target) for one chunk of hidden states; entropy / Σπ² of the chunk are appended to
    `stats` (detached) on the first call only, not when checkpointing recomputes the chunk."""
    z = head(hidden).float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not stats and (want_entropy or want_sum_pi_sq):
        with torch.no_grad():
            zd, lsed = z.detach(), lse.detach()
            if want_entropy:
                stats.append(lsed - (torch.softmax(zd, dim=-1) * zd).sum(-1))
            if want_sum_pi_sq:
                stats.append(torch.exp(torch.logsumexp(2 * zd, dim=-1) - 2 * lsed))
    return logp


def _selected_stats(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None,
                    temperature: float, positions: Tensor, want_entropy: bool, want_sum_pi_sq: bool
                    ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor] | None:
    """Log-probs (and entropy, Σπ²) only where `positions[:, t]` asks for log π(token t): the LM
    head (a V-wide matmul and log-softmax per token) runs on policy tokens only, not on prompts
    and tool output, chunk by chunk. Returns ([N] each, the [B, T-1] selection) or None when the
    model needs the full path."""
    parts = _split_head(model)
    if parts is None:
        return None
    body, head = parts
    sel = positions[:, 1:].to(torch.bool)
    targets = input_ids[:, 1:][sel]
    packed = shared_prefix.plan(input_ids, attention_mask) if _packs(model) else None
    if packed is None:
        hidden = body(input_ids=input_ids, attention_mask=causal_mask_only(attention_mask)).last_hidden_state
        picked = hidden[:, :-1][sel]
    else:  # the rows' common prompt once (trainer/shared_prefix.py)
        ids, pos = shared_prefix.pack(input_ids, packed)
        # a mask of ones, so transformers does not read the restarting position ids as separate
        # packed sequences and build an [L, L] mask that the packed attention would ignore anyway
        hidden = body(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids),
                      **{SHARED_PREFIX: packed}).last_hidden_state[0]
        index = shared_prefix.packed_index(packed, input_ids.shape[1]).to(hidden.device)
        picked = hidden[index[:, :-1][sel]]
    grad = torch.is_grad_enabled() and picked.requires_grad
    logps: list[Tensor] = []
    ents: list[Tensor] = []
    sqs: list[Tensor] = []
    for i in range(0, max(picked.shape[0], 1), CHUNK_TOKENS):
        h, y = picked[i:i + CHUNK_TOKENS], targets[i:i + CHUNK_TOKENS]
        stats: list[Tensor] = []
        args = (head, h, y, temperature, want_entropy, want_sum_pi_sq, stats)
        logps.append(checkpoint(_chunk_stats, *args, use_reentrant=False) if grad else _chunk_stats(*args))
        if want_entropy:  # `stats` stays filled so a recompute in backward skips these
            ents.append(stats[0])
        if want_sum_pi_sq:
            sqs.append(stats[-1])
    return (torch.cat(logps), torch.cat(ents) if want_entropy else None,
            torch.cat(sqs) if want_sum_pi_sq else None, sel)


def _scatter(values: Tensor, sel: Tensor) -> Tensor:
    """Put per-selected-token values back at their [B, T] positions (zeros elsewhere)."""
    out = values.new_zeros(sel.shape)
    out[sel] = values
    return _pad_first(out)


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
                             temperature: float = 1.0, positions: Tensor | None = None,
                             entropy: bool = True, sum_pi_sq: bool = True) -> TokenStats:
    """Log-probs plus entropy and Σπ² from the same forward pass (all [B, T], column 0 = 0).

    Entropy and Σπ² are detached: they are metrics / OTB weights, never loss terms; each is
    computed only when its flag is set (None otherwise). With `positions` ([B, T] bool, e.g. the
    loss mask) the three are computed only there (zeros elsewhere), which skips the LM head on
    prompt and observation tokens."""
    _check(input_ids, attention_mask, temperature)
    picked = None if positions is None else _selected_stats(model, input_ids, attention_mask, temperature,
                                                             positions, entropy, sum_pi_sq)
    if picked is not None:
        lp, ent, sq, sel = picked
        return TokenStats(logprobs=_scatter(lp, sel), entropy=None if ent is None else _scatter(ent, sel),
                          sum_pi_sq=None if sq is None else _scatter(sq, sel))
    logits = _logits(model, input_ids, attention_mask, temperature)
    logprobs = _pad_first(logprobs_from_logits(logits, input_ids[:, 1:]))
    with torch.no_grad():
        ent_t = _pad_first(entropy_from_logits(logits)) if entropy else None
        sq_t = _pad_first(sum_pi_sq_from_logits(logits)) if sum_pi_sq else None
    return TokenStats(logprobs=logprobs, entropy=ent_t, sum_pi_sq=sq_t)
