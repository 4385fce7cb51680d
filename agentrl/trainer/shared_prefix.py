"""One forward pass for the prompt that every row of a micro-batch starts with.

The rows of a training micro-batch begin with the same tokens: the env's system prompt with its
tool schemas (≈460 tokens on `search`), and within a group the task's own prompt too. A padded
[B, T] forward computes those tokens B times. Here they are packed into one sequence instead:

    [ prefix (P tokens) | suffix of row 0 | suffix of row 1 | ... ]

with each suffix's position ids continuing from P, and an attention in which the prefix is
causal over itself and each suffix attends to the whole prefix and causally to itself, never to
another suffix. Every token then sees exactly the context it has in its own row, so the hidden
states, log-probs and gradients are those of the padded pass (to float rounding: the kernels
block the sums differently); the prefix's gradient is the sum of what every row sends it, which
autograd does by itself since the suffixes read the same prefix keys and values.

A `search` micro-batch (4 rows of ~870 tokens, 460 shared) computes 42% fewer tokens
(`bench/learner.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Below this many shared tokens the packed pass does not pay for its extra attention calls.
MIN_SHARED_TOKENS = 32


@dataclass
class SharedPrefix:
    """The packed layout of one micro-batch: `prefix` tokens, then each row's suffix at
    `offsets[i]` with `lengths[i]` tokens; `masks[i]` is suffix i's [lengths[i], prefix + lengths[i]]
    boolean attention mask (True = attend), built once and used by every layer."""

    prefix: int
    offsets: list[int]
    lengths: list[int]
    masks: list[Tensor]


def right_padded(attention_mask: Tensor | None) -> bool:
    """Whether every row is its real tokens then padding (ones, then zeros); no mask: no padding."""
    return attention_mask is None or bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def common_prefix_length(input_ids: Tensor, lengths: list[int]) -> int:
    """The number of leading tokens all rows share, at most one less than the shortest row (so
    every row keeps a suffix of its own)."""
    shortest = min(lengths)
    same = (input_ids[:, :shortest] == input_ids[:1, :shortest]).all(0)
    differ = (~same).nonzero()
    shared = int(differ[0]) if len(differ) else shortest
    return min(shared, shortest - 1)


def plan(input_ids: Tensor, attention_mask: Tensor | None) -> SharedPrefix | None:
    """The packed layout for right-padded rows, or None where sharing saves too little (one row,
    fewer than MIN_SHARED_TOKENS in common, or rows that are not right-padded)."""
    rows, width = input_ids.shape
    if rows < 2:
        return None
    if not right_padded(attention_mask):
        return None  # left padding or holes: not the layout this packs
    lengths = [width] * rows if attention_mask is None else attention_mask.sum(-1).tolist()
    prefix = common_prefix_length(input_ids, lengths)
    if prefix < MIN_SHARED_TOKENS:
        return None
    suffixes = [n - prefix for n in lengths]
    offsets = [prefix + sum(suffixes[:i]) for i in range(rows)]
    device = input_ids.device
    masks = []
    for n in suffixes:
        own = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        masks.append(torch.cat([torch.ones(n, prefix, dtype=torch.bool, device=device), own], dim=1))
    return SharedPrefix(prefix, offsets, suffixes, masks)


def pack(input_ids: Tensor, spec: SharedPrefix) -> tuple[Tensor, Tensor]:
    """(token ids [1, L], position ids [1, L]) of the packed sequence."""
    p = spec.prefix
    ids = [input_ids[0, :p]] + [input_ids[i, p:p + n] for i, n in enumerate(spec.lengths)]
    pos = [torch.arange(p)] + [torch.arange(p, p + n) for n in spec.lengths]
    return torch.cat(ids)[None], torch.cat(pos).to(input_ids.device)[None]


def packed_index(spec: SharedPrefix, width: int) -> Tensor:
    """[B, width] index into the packed sequence of each row position (0 past a row's end)."""
    index = torch.zeros(len(spec.lengths), width, dtype=torch.long)
    for i, (offset, n) in enumerate(zip(spec.offsets, spec.lengths)):
        index[i, :spec.prefix] = torch.arange(spec.prefix)
        index[i, spec.prefix:spec.prefix + n] = torch.arange(offset, offset + n)
    return index
