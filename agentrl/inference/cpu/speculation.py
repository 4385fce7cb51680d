"""Prompt-lookup speculation for the hf engine: drafts (Saxena 2023, "Prompt Lookup Decoding"; vLLM's
`ngram` speculative method), the tokens that followed the latest earlier occurrence of a sequence's
last n-gram, and how many of them a step feeds (`draft_width`, weighed by the forward cost the
engine fits on this machine, `ForwardCost`).

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


# A forward pass's cost on a CPU is a fixed part (streaming the weights, ~30 layers of kernel
# launches) plus a part per token fed: SmolLM2-135M in bf16 on one core took 66 + ~1.6 ms per
# token (1-16 rows x 1-5 tokens over 400 cached, stop 38), so the fixed part is worth ~40 tokens
# there; on the 2-core EPYC ~30 + ~2.75 ms, ~11 tokens. The engine fits its own (`ForwardCost`)
# and starts from this.
FORWARD_FIXED_TOKENS = 40


class ForwardCost:
    """A decode step's forward seconds as `fixed + per_token · tokens fed`, fitted by least squares
    over the engine's recent decode steps (weights decaying by `decay` a step), so that the draft
    width weighs speculation against this machine's costs: at ~11 tokens' worth of fixed cost
    instead of 40, drafts kept one time in three no longer pay (single-turn code answers on the
    EPYC: 153 tokens/s without speculation, 142 with 4 drafts a row at the fixed 40)."""

    def __init__(self, default: float = FORWARD_FIXED_TOKENS, decay: float = 0.995, min_weight: float = 32.0,
                 min_spread: float = 2.0) -> None:
        self.default, self.decay, self.min_weight, self.min_spread = default, decay, min_weight, min_spread
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        k = self.decay
        self.w, self.sx, self.sy = k * self.w + 1, k * self.sx + tokens, k * self.sy + seconds
        self.sxx, self.sxy = k * self.sxx + tokens * tokens, k * self.sxy + tokens * seconds

    def fixed_tokens(self) -> float:
        """The fixed part in tokens' worth (intercept / slope), or `default` until the steps seen
        vary enough in width (a spread of `min_spread` tokens) to fit a slope."""
        if self.w < self.min_weight:
            return self.default
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        if var < self.min_spread ** 2:
            return self.default
        slope = (self.sxy / self.w - mx * my) / var
        intercept = my - slope * mx
        if slope <= 0 or intercept <= 0:
            return self.default
        return min(max(intercept / slope, 1.0), 4 * self.default)


def draft_width(lengths: list[int], acceptance: list[float], fixed: float = FORWARD_FIXED_TOKENS) -> int:
    """How many draft tokens per row the next step feeds: the d that maximises expected tokens
    emitted per unit of forward cost, (rows + Σ_i Σ_{j≤min(len_i, d)} a_i^j) / (fixed + rows·(1+d)),
    where a draft's j-th token is kept with chance a_i^j (each earlier one kept too). Every row
    pays for the widest draft (the batch is one padded rectangle), so a lone long draft in a big
    batch is not worth feeding. 0 means a plain decode step."""
    rows = len(lengths)
    best, best_rate = 0, rows / (fixed + rows)
    gain = 0.0
    for d in range(1, max(lengths, default=0) + 1):
        gain += sum(a ** d for n, a in zip(lengths, acceptance) if n >= d)
        rate = (rows + gain) / (fixed + rows * (1 + d))
        if rate > best_rate:
            best, best_rate = d, rate
    return best
