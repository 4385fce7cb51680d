"""Prompt-lookup drafts (Saxena 2023, "Prompt Lookup Decoding"; vLLM's `ngram` speculative method):
the tokens that followed the latest earlier occurrence of a sequence's last n-gram.

An agent's context repeats itself: each turn's tool call has the format of the last one, and an
answer copies fields out of a tool's output. Those continuations cost one verifying forward pass
instead of one decode step per token (hf.py's `_speculate`).
"""

from __future__ import annotations

import numpy as np


def propose_continuation(tokens: list[int], k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the last n tokens of
    `tokens`, trying n from `max_n` down to `min_n`; [] when no such n-gram occurs earlier."""
    if k < 1 or len(tokens) <= min_n:
        return []
    seq = np.asarray(tokens, dtype=np.int64)
    end = len(seq)
    for n in range(min(max_n, end - 1), min_n - 1, -1):
        # windows seq[i:i+n], i < end - n (so at least one token follows), equal to the last n tokens
        match = seq[: end - n] == seq[end - n]
        for j in range(1, n):
            match &= seq[j: end - n + j] == seq[end - n + j]
        hits = np.flatnonzero(match)
        if len(hits):
            start = int(hits[-1]) + n
            return seq[start: start + k].tolist()
    return []
