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

A bf16 decode step (one query per row, the engine under the trainer's bf16 autocast) goes where
it is fastest on this CPU (`half_precision_flash`). With AMX tiles, torch's CPU flash kernel packs
its half-precision blocks for them and wins: 1.5-6.6x faster than the grouped matmuls below (1-16
rows x 1-16 queries over 100-3000 keys, one thread, a 2-core Xeon with AMX, stop 41). Without
AMX, the same kernel runs a one-token bf16 query 10x slower than fp32 (12.3 vs 1.1 ms for 16 rows x
9 heads over 300 keys on an AVX512-BF16 AMD EPYC, stop 28), so there `grouped_decode_attention`
takes it: two batched matmuls with the query heads of a group stacked as rows, 0.76 ms (5.9 vs
47.5 ms over 2000 keys); its scores and softmax stay fp32 as in the flash kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SDPA_GQA = "sdpa_gqa"
SHARED_PREFIX = "shared_prefix"  # the forward kwarg that carries a packed layout (trainer/shared_prefix.py)
RAGGED = "ragged_parts"  # the forward kwarg that carries a ragged pass's parts (an engine step, `RaggedPart`)
# Queries per row up to which a low-precision attention takes `grouped_decode_attention` (a decode
# step, a speculative step's verification); longer ones (a prefill) go to torch's kernel.
MAX_GROUPED_QUERIES = 16


@functools.cache
def half_precision_flash() -> bool:
    """Whether a low-precision decode step takes torch's flash kernel (True: the CPU has AMX tiles)
    or `grouped_decode_attention` (every other CPU: AVX2, AVX-512, ARM). Asked at the first such
    step, not at import."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private in torch 2.13; absent: assume none
    return bool(probe()) if probe is not None else False


def sdpa_gqa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention (same arguments, same causal rule) with grouped key/value heads
    passed to torch unrepeated; anything else (one head per group, a paged cache, a position
    bias, a CUDA device) goes to transformers' own function."""
    if (packed := kwargs.get(SHARED_PREFIX)) is not None:  # a learner's packed micro-batch
        return shared_prefix_attention(query, key, value, packed, dropout, scaling), None
    if (parts := kwargs.get(RAGGED)) is not None:  # an engine step's rectangles in one pass
        return ragged_attention(module, query, key, value, parts, dropout, scaling), None
    grouped = (getattr(module, "num_key_value_groups", 1) > 1 and query.device.type == "cpu"
               and kwargs.get("cache") is None and kwargs.get("position_bias") is None)
    # A one-token query attends to every cached key; transformers drops the mask when no row is
    # padded (a batch of one, rows of equal length), and that case must not reach the slow kernel.
    # A few queries per row (a speculative step's verification) come with their causal mask.
    short = query.shape[2] == 1 or (query.shape[2] <= MAX_GROUPED_QUERIES and attention_mask is not None)
    if grouped and short and dropout == 0.0 and (low := _low_precision(query)) is not None:
        q, k, v = (t.to(low) for t in (query, key, value))  # what autocast would hand torch's kernel
        if not half_precision_flash():
            return grouped_decode_attention(q, k, v, attention_mask, scaling), None
        return flash_decode_attention(q, k, v, attention_mask, scaling), None
    if not grouped or attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    # With a mask, transformers' rule makes every call non-causal: the mask carries causality.
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


@dataclass
class RaggedPart:
    """One rectangle of a ragged pass: `rows` x `width` fed tokens at `offset` of the flat sequence,
    attending to `cache` (which takes their keys and values) under `mask` [rows, 1, width, cached +
    width], True where a query may attend."""

    offset: int
    rows: int
    width: int
    cache: Any
    mask: torch.Tensor


def causal_padding_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    """The 4-D boolean mask transformers builds for `width` new tokens per row over a cache: from
    a 2-D padding mask [rows, cached + width] (0 = padding), each new token attends to the real
    columns up to its own."""
    causal = torch.ones(width, mask.shape[1], dtype=torch.bool, device=mask.device).tril(mask.shape[1] - width)
    return mask.bool()[:, None, None, :] & causal


def ragged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     parts: list[RaggedPart], dropout: float, scaling: float | None) -> torch.Tensor:
    """Attention for one flat sequence [1, H, N, D] made of several rectangles (a decode batch's
    next tokens, new rows' prompts): the linear layers ran over all N tokens at once, and here each
    rectangle's keys and values go into its own cache and its queries attend to that cache as in a
    pass of its own (the same `sdpa_gqa_attention` branch). Returns [1, N, H, D]."""
    outs = []
    for part in parts:
        span = slice(part.offset, part.offset + part.rows * part.width)
        q, k, v = (t[0, :, span].unflatten(1, (part.rows, part.width)).transpose(0, 1) for t in (query, key, value))
        k, v = part.cache.update(k, v, module.layer_idx)
        out, _ = sdpa_gqa_attention(module, q, k, v, part.mask, dropout=dropout, scaling=scaling)
        outs.append(out.reshape(part.rows * part.width, *out.shape[2:]))
    return torch.cat(outs)[None]


def shared_prefix_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: Any,
                            dropout: float, scaling: float | None) -> torch.Tensor:
    """Attention over one packed sequence [shared prefix | suffix 0 | suffix 1 | ...]: query
    [1, Hq, L, D], key and value [1, Hkv, L, D] (position-encoded already). The prefix is causal over
    itself; suffix i (at `packed.offsets[i]`, `packed.lengths[i]` tokens) attends to the whole prefix
    and, through `packed.masks[i]`, causally to itself. Returns [1, L, Hq, D]."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gqa = key.shape[1] != query.shape[1]
    p = packed.prefix
    prefix_k, prefix_v = key[:, :, :p], value[:, :, :p]
    outs = [sdpa(query[:, :, :p], prefix_k, prefix_v, dropout_p=dropout, is_causal=True, scale=scaling,
                 enable_gqa=gqa)]
    for offset, n, mask in zip(packed.offsets, packed.lengths, packed.masks):
        own = slice(offset, offset + n)
        k = torch.cat([prefix_k, key[:, :, own]], dim=2)
        v = torch.cat([prefix_v, value[:, :, own]], dim=2)
        outs.append(sdpa(query[:, :, own], k, v, attn_mask=mask, dropout_p=dropout, scale=scaling,
                         enable_gqa=gqa))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def _low_precision(query: torch.Tensor) -> torch.dtype | None:
    """The half-precision dtype attention runs in: autocast's on this device (it casts sdpa's
    inputs; rotary embeddings leave the query and keys fp32 before that), else the query's own."""
    kind = query.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else query.dtype
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def grouped_decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """Attention of a few queries per row over grouped key/value heads: query [B, Hq, q, D], key and
    value [B, Hkv, T, D], a boolean (True = attend) or additive mask broadcastable to [B, 1, q, T],
    or None (every key attended; only for q = 1).
    The Hq / Hkv query heads of a group (and the q queries) are the rows of one matmul against their
    shared keys; scores and softmax in fp32, the weighted sum in the input dtype. Returns [B, q, Hq, D]."""
    batch, heads, queries, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, group * queries, dim)
    # keys @ queryᵀ, not query @ keysᵀ: the cache's keys are a view of a buffer with spare columns,
    # and the bf16 CPU matmul copies a strided right-hand operand whole (5.2 vs 0.7 ms, 8 rows x
    # 2000 keys) but reads a strided left-hand one in place
    scores = torch.matmul(key, grouped.transpose(-1, -2)).transpose(-1, -2).float()
    scores *= scaling if scaling is not None else dim ** -0.5
    if attention_mask is not None:
        scores = scores.view(batch, kv_heads, group, queries, length)
        mask = attention_mask.expand(attention_mask.shape[0], 1, queries, length)[:, :, None]
        if mask.dtype == torch.bool:
            # the lowest finite score, not -inf: a query that may attend to nothing (a prefill's
            # left padding) gets finite weights instead of NaN, which the next layer would read
            # back through its masked key as 0 * NaN; rows with a key to attend are unchanged
            scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
        else:
            scores += mask
        scores = scores.view(batch, kv_heads, group * queries, length)
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(weights, value).view(batch, heads, queries, dim)
    return out.transpose(1, 2).contiguous() if queries > 1 else out.reshape(batch, 1, heads, dim)


def flash_decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """`grouped_decode_attention`'s contract (same shapes, returns [B, q, Hq, D]) on torch's flash
    kernel. One query per row goes in with grouped heads (`enable_gqa`). Several (a speculative
    step's verification, a short prefill) go in as one query block per key/value head, the group's
    query heads stacked on the query axis with the mask repeated per head: each key/value head is
    then read once, not once per query head (1.4-1.65x faster at 3-5 queries per row over 340 keys;
    at one query the grouped-head path is 1.4x faster). A query that may attend to nothing (a
    prefill's left padding) gets zeros from this kernel, not NaN."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    batch, heads, queries, dim = query.shape
    if queries == 1:
        out = sdpa(query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
        return out.reshape(batch, 1, heads, dim)
    kv_heads = key.shape[1]
    group = heads // kv_heads
    stacked = query.reshape(batch, kv_heads, group * queries, dim)  # head h = kv head h // group, as in GQA
    mask = attention_mask
    if mask is not None:
        mask = mask.expand(mask.shape[0], 1, queries, mask.shape[-1]).repeat(1, 1, group, 1)
    out = sdpa(stacked, key, value, attn_mask=mask, scale=scaling).view(batch, heads, queries, dim)
    return out.transpose(1, 2).contiguous()


def register() -> str:
    """Register `sdpa_gqa` with transformers (idempotent); returns the name to load models with."""
    AttentionInterface.register(SDPA_GQA, sdpa_gqa_attention)
    AttentionMaskInterface.register(SDPA_GQA, sdpa_mask)  # the same boolean masks sdpa gets
    return SDPA_GQA
