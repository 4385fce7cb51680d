"""Token sampling with the log-probs of the distribution actually sampled from.

The behaviour policy π_roll of algorithms.md §0 (notation table) and §7.2 is the *processed*
distribution: logits / temperature, then nucleus (top-p) filtering and renormalisation. These
are the log-probs vLLM returns with `logprobs_mode="processed_logprobs"`; the hf engine returns
the same, so importance ratios against the trainer are taken against what was really sampled.
"""

from __future__ import annotations

import torch


def processed_logprobs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Log-probs of the processed distribution, one row per sequence.

    logits (B, V); temperature (B,), 0 meaning greedy (the row is left at temperature 1, its
    log-probs are then those of the unscaled model); top_p (B,) in (0, 1].
    Nucleus rule as in vLLM (Holtzman et al. 2020, "The Curious Case of Neural Text
    Degeneration"): keep a token when the mass of strictly more probable tokens is < p, so the
    most probable token always survives; the kept set is renormalised (algorithms.md §7.2,
    π̃ = π·1[v∈V]/Σ_{u∈V}π(u)). Removed tokens get -inf.
    """
    logits = logits.float()
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    if not bool((temp == 1).all()):  # x / 1 is x: skip a B x V division a decode step at temperature 1
        logits = logits / temp[:, None]
    logp = torch.log_softmax(logits, dim=-1)
    if bool((top_p >= 1).all()):
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()
    drop_sorted = mass_before >= top_p.float()[:, None]
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


SAMPLERS = ("gumbel_max", "inverse_cdf", "multinomial")


def sample_tokens(logp: torch.Tensor, greedy: list[bool], generators: list[torch.Generator],
                  method: str = "gumbel_max") -> tuple[list[int], list[float]]:
    """Draw one token per row from processed log-probs `logp` (B, V) with that row's generator
    (so a seeded request is reproducible whatever else shares its batch); greedy rows take the
    argmax. Returns the tokens and their log-probs under `logp`.

    `method` picks how a sampled row draws; all three draw from `logp` exactly:
    - `gumbel_max` (default): the Gumbel-max trick (below). Stable under the ~1e-6 noise a
      batch's kernel shapes put on fp32 log-probs, so a seeded row keeps its tokens in any batch.
    - `inverse_cdf`: one uniform per row through the row's float64 CDF; its cumulative sum
      carries that noise to every interval boundary (on a CPU without AMX a seeded row drew
      another tail token within 12 tokens in a batch of 4; see `gumbel_max`).
    - `multinomial`: `torch.multinomial` (an exponential per vocabulary entry, 1.5 ms a row of
      SmolLM2's 49152 on one core), kept for benchmarks of the engine as issue 17 filed it."""
    if logp.device.type != "cpu":
        logp = logp.cpu()  # the rows' generators are CPU ones, seeded per request (one B x V copy a step)
    tokens = [0] * len(greedy)
    sampled = [i for i, is_greedy in enumerate(greedy) if not is_greedy]
    for i, is_greedy in enumerate(greedy):
        if is_greedy:
            tokens[i] = int(logp[i].argmax())
    if sampled:
        if method == "multinomial":
            drawn = [int(torch.multinomial(logp[i].exp(), 1, generator=generators[i])) for i in sampled]
        elif method == "inverse_cdf":
            uniform = torch.stack([torch.rand((), generator=generators[i], dtype=torch.float64) for i in sampled])
            drawn = inverse_cdf(logp[sampled], uniform).tolist()
        else:
            drawn = gumbel_max(logp[sampled], [generators[i] for i in sampled]).tolist()
        for i, token in zip(sampled, drawn):
            tokens[i] = token
    picked = logp[torch.arange(len(tokens)), torch.tensor(tokens)]
    return tokens, picked.tolist()


GUMBEL_BLOCK = 256  # vocabulary entries per block of gumbel_max's first stage


def gumbel_max(logp: torch.Tensor, generators: list[torch.Generator], block: int = GUMBEL_BLOCK) -> torch.Tensor:
    """One token per row (B, V) of log-probs by the Gumbel-max trick, in two stages: argmax_v
    (log π(v) + G_v), G_v iid standard Gumbel, is a draw from π, and the best score in a set S
    is distributed as log Σ_S π + G, independently of which v in S attains it (max-stability;
    Maddison, Tarlow & Minka 2014, "A* Sampling"). So a row picks a block of `block` entries by
    argmax_b (logsumexp_b + G_b), then a token in it by argmax (log π(v) + G'_v): the same
    distribution from n_blocks + block Gumbels (448 for SmolLM2) instead of V.

    Log-prob noise of ε (a batch's fp32 kernel shapes give ~1e-6) changes a draw only when two
    best scores lie within ε, probability ~ε; an inverse CDF moves with the summed noise of every
    earlier entry, probability ~ V·ε. G = −log E, E = −log(1−u) from a float64 u: small E, the
    likely winners, keep float32 precision. A token of log-prob −inf (top-p removed) is never
    drawn. Draws come from the row's own generator, a fixed number per call."""
    rows, vocab = logp.shape
    n_blocks = -(-vocab // block)
    blocks = logp.float()
    if n_blocks * block != vocab:  # pad the last block (SmolLM2's 49152 needs none: no copy a step)
        blocks = torch.nn.functional.pad(blocks, (0, n_blocks * block - vocab), value=float("-inf"))
    blocks = blocks.reshape(rows, n_blocks, block)
    uniform = torch.stack([torch.rand(n_blocks + block, generator=g, dtype=torch.float64) for g in generators])
    log_exponential = uniform.float().neg_().log1p_().neg_().clamp_(min=torch.finfo(torch.float32).tiny).log_()
    best_block = (torch.logsumexp(blocks, -1) - log_exponential[:, :n_blocks]).argmax(-1)
    in_block = (blocks[torch.arange(rows), best_block] - log_exponential[:, n_blocks:]).argmax(-1)
    return best_block * block + in_block


def inverse_cdf(logp: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The token of each row (B, V) whose CDF interval holds `uniform` (B,) in [0, 1): the first v
    with CDF(v) > u·CDF(V). In float64, so that the tail's many tiny probabilities keep their
    mass (a float32 CDF near 1 drops increments below 6e-8); a token of probability 0 (top-p
    removed) has an empty interval and is never drawn."""
    cdf = logp.double().exp().cumsum(-1)
    total = cdf[:, -1]
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))  # < total
    return torch.searchsorted(cdf, target[:, None], right=True)[:, 0]
