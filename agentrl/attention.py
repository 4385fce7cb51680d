"""Grouped-query attention without copying the key/value heads: transformers' `sdpa` attention,
registered as `sdpa_gqa`, that hands torch the grouped heads as they are (`enable_gqa=True`).

transformers' own `sdpa` passes `enable_gqa` only when there is no attention mask (the CUDA
kernels' condition); with a mask — every padded batch, so every decode step of the rollout engine
and every training forward — it first materialises each layer's keys and values repeated per
query head (`repeat_kv`). On CPU torch's kernels take masks with grouped heads, so the copy buys
nothing: for SmolLM2-135M (9 query heads over 3 key/value heads) one decode step of 11 rows over
2000 cached tokens costs 1.25 CPU-s with transformers' sdpa and 0.58 with this one, logits equal
to the bit (`bench/inference.py --decode-rows 11 --decode-context 2000`, docs/benchmarks.md).
Gradients agree to fp32 rounding (a group's contributions are summed in another order).

`load_model` loads every model with it, the learner's and the engines', so the trainer and the
rollout engine keep computing log-probs the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SDPA_GQA = "sdpa_gqa"


def sdpa_gqa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention (same arguments, same causal rule) with grouped key/value heads
    passed to torch unrepeated; anything else (one head per group, a paged cache, a position
    bias, a CUDA device) goes to transformers' own function."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or query.device.type != "cpu" or kwargs.get("cache") is not None
            or kwargs.get("position_bias") is not None or attention_mask is None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    # With a mask, transformers' rule makes every call non-causal: the mask carries causality.
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register `sdpa_gqa` with transformers (idempotent); returns the name to load models with."""
    AttentionInterface.register(SDPA_GQA, sdpa_gqa_attention)
    AttentionMaskInterface.register(SDPA_GQA, sdpa_mask)  # the same boolean masks sdpa gets
    return SDPA_GQA
